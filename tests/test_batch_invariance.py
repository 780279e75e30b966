"""Seeded requests give the same tokens and logprobs, bit for bit, alone and in a crowd, on the default model in this
machine's default dtype, float32, the quantized modes and the recorded decode (each engine built as `nanoserve generate`
builds it), and through a real `nanoserve serve` with the openai client (sent together, then one at a time). Each case
has its control: the same workload with the mode left (`batch_invariant=False`) gives a crowd other bits than its solo
runs, so the comparison sees what the mode prevents. The workload makes the batch matter on any CPU: a token budget of 16
a step (the prompts are longer) splits each prompt's prefill at boundaries that depend on what else runs, and a crowd
mixes prefill chunks and decodes in a step; with its own kernels taking every row count the same way (AVX512-BF16
without AMX), this is where the mode's attention, not its products, keeps a row's bits. Each setup is confirmed from the
engine's own counters: requests run together, preemptions, replays. Which kernel paths these runs covered on this CPU is
printed at the end of the run (tests/conftest.py)."""
import asyncio, json, subprocess, sys
from pathlib import Path
import httpx, openai, pytest
from nanoserve.loadgen import spawn_server
from nanoserve.engine import Engine, EngineConfig, make_cache
from nanoserve.launch import build_engine
from nanoserve.quant import quantize_model
from nanoserve.integer import a8_isa
from nanoserve.sampling import SamplingParams

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
TOPICS = ('the ocean', 'a lighthouse', 'bread baking', 'the moon', 'a city at night', 'autumn leaves',
          'a robot learning to paint', 'coffee', 'mountains', 'a library', 'trains', 'the desert')
BUDGET = 16                   # tokens a step: less than every prompt, so a prefill is chunked where the batch puts it
CHUNKED = dict(max_num_batched_tokens=BUDGET)
TIGHT = dict(num_kv_blocks=12, max_model_len=192)       # a pool a crowd of 8 outgrows: some requests are preempted

def seeded_requests() -> list[dict]:
    "The issue's twelve: seeded chats at temperature 0.8, top_p 0.95, seeds 1000-1011, 8-24 tokens, two logprobs."
    def one(i, topic):
        return {'messages': [{'role': 'user', 'content': f'Write a short poem about {topic}.'}], 'temperature': 0.8,
                'top_p': 0.95, 'seed': 1000 + i, 'max_tokens': 8 + (i * 7) % 17, 'logprobs': 2}
    return [one(i, t) for i, t in enumerate(TOPICS)]

def run(model, beside=None, **config) -> tuple[list[tuple], object]:
    """Each request's (token ids, logprobs), all queued at once, and the engine that ran them (an `EngineConfig` of
    `config`, built by `build_engine` as `nanoserve generate` builds one; or, `beside` an engine already built for the
    same model and mode, a new engine over its loaded model, so that a mode's batch shapes load it once)."""
    if beside is None: engine = build_engine(model, EngineConfig(**config), quantize=quantize_model)
    else:
        cfg = EngineConfig(**config)
        engine = Engine.assemble(beside.model, beside.tokenizer, make_cache(beside.model, cfg), cfg, beside.stop_ids)
    reqs = seeded_requests()
    params = [SamplingParams(**{k: v for k, v in r.items() if k != 'messages'}) for r in reqs]
    outs = engine.generate([r['messages'] for r in reqs], params, use_tqdm=False)
    assert all(len(p) > BUDGET for p in (o.prompt_token_ids for o in outs)), 'a prompt the budget does not chunk'
    assert all(o.token_ids and o.logprobs for o in outs)
    return [(o.token_ids, o.logprobs) for o in outs], engine

def differing(a: list, b: list) -> list[int]: return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]

def ran_together(engine, at_least: int = 4) -> bool:
    "Whether the engine's own count of requests a step says some steps ran `at_least` of them together."
    return max(engine.snapshot().steps_by_batch) >= at_least

MODES = {'default-dtype': {}, 'float32': dict(dtype='float32'), 'int8': dict(quantization='int8'),
         'int4': dict(quantization='int4'), 'w8a8': dict(quantization='w8a8'), 'w4a8': dict(quantization='w4a8')}

@pytest.mark.parametrize('mode', MODES)
def test_crowd_and_tight_pool_equal_alone_and_the_control_differs(default_model, mode):
    """The default (batch-invariant here): a crowd of 8, and one in a 12-block pool that preempts, give the solo bits;
    with the mode left, the crowd does not."""
    if mode in ('w8a8', 'w4a8') and a8_isa() is None: pytest.skip("no AVX512-VNNI here: the integer modes are refused")
    kw = MODES[mode] | CHUNKED
    alone, solo = run(default_model, max_batch_size=1, **kw)
    assert solo.runner.batch_invariant, solo.runner.invariance
    crowd, eng = run(default_model, solo, max_batch_size=8, **kw)
    assert ran_together(eng) and differing(alone, crowd) == []
    tight, eng = run(default_model, solo, max_batch_size=8, **TIGHT, **kw)
    assert eng.snapshot().num_preemptions > 0 and differing(alone, tight) == []
    off_alone, off = run(default_model, max_batch_size=1, batch_invariant=False, **kw)
    off_crowd, eng = run(default_model, off, max_batch_size=8, batch_invariant=False, **kw)
    assert ran_together(eng) and not eng.runner.batch_invariant
    assert differing(off_alone, off_crowd) != [], 'the control shows nothing: leaving the mode changed no bit'

RECORDED = dict(bucket_decode=True, persist_inputs=True, capture_decode=True, max_model_len=256, warm_rows=8)

@pytest.mark.parametrize('recorder', ['compile', 'decode_call'])
def test_recorded_decode_equals_eager(default_model, recorder):
    """With the capture on, a crowd gives the eager solo run's bits: through the compile recorder, and through the decode
    call, the CPU's default recorder where the model takes it. Its decode steps replay (its own counter says so); with
    the mode left, the recorded crowd gives other bits than the eager solo run."""
    alone, _ = run(default_model, max_batch_size=1, max_model_len=256, **CHUNKED)
    crowd, eng = run(default_model, max_batch_size=8, capture_recorder=recorder, **RECORDED, **CHUNKED)
    assert eng.decode_path.replays > 0 and ran_together(eng), eng.decode_path.stats
    assert differing(alone, crowd) == []
    off_alone, _ = run(default_model, max_batch_size=1, max_model_len=256, batch_invariant=False, **CHUNKED)
    off, eng = run(default_model, max_batch_size=8, capture_recorder=recorder, batch_invariant=False, **RECORDED,
                   **CHUNKED)
    assert eng.decode_path.replays > 0 and differing(off_alone, off) != []

def generate(model, prompts_file, *flags) -> list[tuple]:
    "Each request's (token ids, logprobs) from `generate --prompts-file --json` (floats print as they round-trip)."
    cmd = [NANOSERVE, 'generate', '--model', str(model), '--prompts-file', str(prompts_file), '--json', *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == len(TOPICS) and all(r['completion_tokens'] >= 1 and r['logprobs'] for r in rows)
    return [(r['token_ids'], r['logprobs']) for r in rows]

def test_the_command_line_gives_the_same_bits(default_model, tmp_path):
    """`nanoserve generate --prompts-file`: `--batch-invariant` gives the default's bits, and both give the in-process
    solo run's; `--no-batch-invariant` gives other bits in a crowd."""
    f = tmp_path/'prompts.jsonl'
    f.write_text(''.join(json.dumps(r) + '\n' for r in seeded_requests()))
    budget = ('--max-num-batched-tokens', str(BUDGET))
    crowd = generate(default_model, f, '--max-batch-size', '8', *budget)
    assert generate(default_model, f, '--max-batch-size', '8', '--batch-invariant', *budget) == crowd
    solo = [(ids, [{str(t): v for t, v in lp.items()} for lp in lps])                # as --json prints them
            for ids, lps in run(default_model, max_batch_size=1, **CHUNKED)[0]]
    assert crowd == solo
    assert differing(generate(default_model, f, '--max-batch-size', '8', '--no-batch-invariant', *budget), crowd) != []

async def chat_all(client, model: str, requests: list[dict], together: bool) -> list[tuple]:
    async def one(r):
        c = await client.chat.completions.create(model=model, messages=r['messages'], temperature=0.9, top_p=r['top_p'],
                                                 seed=r['seed'], max_tokens=r['max_tokens'], logprobs=True,
                                                 top_logprobs=2)
        ch = c.choices[0]
        tops = lambda t: [(x.token, x.logprob) for x in t.top_logprobs]
        return ch.message.content, [(t.token, t.logprob, tops(t)) for t in ch.logprobs.content]
    if together: return list(await asyncio.gather(*map(one, requests)))
    return [await one(r) for r in requests]

def serve_both_ways(model, *flags) -> tuple[list, list, dict, dict]:
    """Twelve seeded chats through a real server and the openai client, together and then one at a time; /health after
    each (its counters say how many requests the steps ran together)."""
    reqs = seeded_requests()
    base = ('--max-batch-size', '8', '--served-model-name', 'smol', '--generation-config', 'none',
            '--max-num-batched-tokens', str(BUDGET))
    with spawn_server(model, *base, *flags) as (url, _):
        async def both():
            client = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
            together = await chat_all(client, 'smol', reqs, True)
            after_crowd = httpx.get(url + '/health').json()
            return together, await chat_all(client, 'smol', reqs, False), after_crowd
        together, serial, health = asyncio.run(both())
        after = httpx.get(url + '/health').json()
    assert all(lp for _, lp in together) and all(lp for _, lp in serial)
    return together, serial, health, after

def steps_by_batch(health: dict) -> dict[int, int]:
    return {int(k): v for k, v in health['stats']['steps_by_batch'].items()}

def test_server_crowd_equals_one_at_a_time_and_the_control_differs(default_model):
    """Through a real server: the crowd ran together (its /health counters), and gave the bits of the same requests sent
    one at a time; a server started with --no-batch-invariant does not."""
    together, serial, crowd, after = serve_both_ways(default_model)
    assert crowd['batch_invariant']['enabled'] is True, crowd['batch_invariant']
    assert max(steps_by_batch(crowd)) >= 4, crowd['stats']
    # one at a time: every step after the crowd's ran one request
    grown = {n: c - steps_by_batch(crowd).get(n, 0) for n, c in steps_by_batch(after).items()}
    assert {n for n, c in grown.items() if c} == {1}, grown
    assert differing(together, serial) == []
    off_together, off_serial, off, _ = serve_both_ways(default_model, '--no-batch-invariant')
    assert off['batch_invariant']['enabled'] is False and max(steps_by_batch(off)) >= 4
    assert differing(off_together, off_serial) != []

def test_default_is_invariant_where_the_kernels_run():
    "The default config asks for the mode where it can run (auto); the flag and its negation say yes and no."
    assert EngineConfig().batch_invariant is None
    assert EngineConfig(batch_invariant=True).batch_invariant
    assert EngineConfig(batch_invariant=False).batch_invariant is False
