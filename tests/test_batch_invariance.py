"""Seeded requests give the same tokens and logprobs, bit for bit, alone and in a crowd, on the default model in
this machine's default dtype: through `nanoserve generate --prompts-file` (a crowd of 8 against one at a time, a
12-block pool that preempts against a roomy one, float32, the quantized modes, the recorded decode) and through a
real `nanoserve serve` with the openai client (sent together, then one at a time). Which kernel paths these runs
covered on this CPU is printed at the end of the run (tests/conftest.py)."""
import asyncio, json, subprocess, sys
from pathlib import Path
import httpx, openai, pytest
from nanoserve.loadgen import spawn_server
from nanoserve.engine import EngineConfig

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
TOPICS = ('the ocean', 'a lighthouse', 'bread baking', 'the moon', 'a city at night', 'autumn leaves',
          'a robot learning to paint', 'coffee', 'mountains', 'a library', 'trains', 'the desert')

def seeded_requests() -> list[dict]:
    "The issue's twelve: seeded chats at temperature 0.8, top_p 0.95, seeds 1000-1011, 8-24 tokens, two logprobs."
    def one(i, topic):
        return {'messages': [{'role': 'user', 'content': f'Write a short poem about {topic}.'}], 'temperature': 0.8,
                'top_p': 0.95, 'seed': 1000 + i, 'max_tokens': 8 + (i * 7) % 17, 'logprobs': 2}
    return [one(i, t) for i, t in enumerate(TOPICS)]

@pytest.fixture(scope='module')
def prompts_file(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp('invariance')/'prompts.jsonl'
    f.write_text(''.join(json.dumps(r) + '\n' for r in seeded_requests()))
    return f

def generate(model, prompts_file, *flags) -> list[tuple]:
    "Each request's (token ids, logprobs) from `generate --prompts-file --json` (floats print as they round-trip)."
    cmd = [NANOSERVE, 'generate', '--model', str(model), '--prompts-file', str(prompts_file), '--json', *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == len(TOPICS) and all(r['completion_tokens'] >= 1 and r['logprobs'] for r in rows)
    return [(r['token_ids'], r['logprobs']) for r in rows]

def differing(a: list, b: list) -> list[int]: return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]

@pytest.mark.parametrize('mode', [[], ['--dtype', 'float32'], ['--quantization', 'int8'], ['--quantization', 'int4']],
                         ids=['default-dtype', 'float32', 'int8', 'int4'])
def test_generate_crowd_and_tight_pool_equal_alone(default_model, prompts_file, mode):
    "The default (batch-invariant here): a crowd of 8, and one in a 12-block pool that preempts, give the solo bits."
    alone = generate(default_model, prompts_file, '--max-batch-size', '1', *mode)
    crowd = generate(default_model, prompts_file, '--max-batch-size', '8', *mode)
    assert differing(alone, crowd) == []
    pool = ('--num-kv-blocks', '12', '--max-model-len', '192')
    tight = generate(default_model, prompts_file, '--max-batch-size', '8', *pool, *mode)
    assert differing(alone, tight) == []

@pytest.mark.parametrize('recorder', ['compile', 'decode_call'])
def test_generate_recorded_decode_equals_eager(default_model, prompts_file, recorder):
    """With the capture on (every decode step replayed), a crowd gives the eager solo run's bits: through the compile
    recorder, and through the decode call, the CPU's default recorder where the model takes it."""
    alone = generate(default_model, prompts_file, '--max-batch-size', '1', '--max-model-len', '256')
    crowd = generate(default_model, prompts_file, '--max-batch-size', '8', '--max-model-len', '256', '--cuda-graphs',
                     '--warm-rows', '8', '--capture-recorder', recorder)
    assert differing(alone, crowd) == []

def test_the_flag_is_the_default_and_leaving_it_is_seen(default_model, prompts_file):
    """`--batch-invariant` gives the default's bits. `--no-batch-invariant` with oneDNN's products (`--no-amx-linear`:
    its kernels differ with the rows, and there is no own kernel's copy to take every count) gives a crowd other
    logprob bits than its solo runs: the comparison sees what the mode prevents."""
    inv = generate(default_model, prompts_file, '--max-batch-size', '8', '--batch-invariant')
    assert inv == generate(default_model, prompts_file, '--max-batch-size', '8')
    loose = ('--no-batch-invariant', '--no-amx-linear')
    off = generate(default_model, prompts_file, '--max-batch-size', '8', *loose)
    assert differing(generate(default_model, prompts_file, '--max-batch-size', '1', *loose), off) != []

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

def test_server_crowd_equals_one_at_a_time(default_model):
    "Twelve seeded chats through a real server and the openai client: together, then one at a time, the same bits."
    reqs = seeded_requests()
    flags = ('--max-batch-size', '8', '--served-model-name', 'smol', '--generation-config', 'none')
    with spawn_server(default_model, *flags) as (url, _):
        health = httpx.get(url + '/health').json()
        assert health['batch_invariant']['enabled'] is True, health['batch_invariant']
        async def both():
            client = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
            return await chat_all(client, 'smol', reqs, True), await chat_all(client, 'smol', reqs, False)
        together, serial = asyncio.run(both())
    assert all(lp for _, lp in together)
    assert differing(together, serial) == []

def test_default_is_invariant_where_the_kernels_run():
    "The default config asks for the mode where it can run (auto); the flag and its negation say yes and no."
    assert EngineConfig().batch_invariant is None
    assert EngineConfig(batch_invariant=True).batch_invariant
    assert EngineConfig(batch_invariant=False).batch_invariant is False
