"""Day 62, speculative decoding (n-gram proposals): greedy output token for token what it is without speculation, with
its logprobs, on the default model over the bench's extractive, code-edit and random prompts, through the decode call
and through the layers' forward; on the tiny model with random arrivals, aborts and preemptions, the KV pool's
bookkeeping checked after every step and nothing leaked; stop strings and max_tokens inside accepted proposals; the
refusals; and a real server streaming it to the openai client."""
import csv, json, random, re, subprocess, sys
import torch
from pathlib import Path
import httpx, pytest
from hypothesis import given, settings, HealthCheck, strategies as st
import openai
from nanoserve.core import ConfigError
from nanoserve.engine import Engine, EngineConfig
from nanoserve.launch import build_engine
from nanoserve.loadgen import spawn_server
from nanoserve.offline_bench import make_workload, text_workload
from nanoserve.sampling import SamplingParams
from nanoserve.scheduler import SamplingState, ScheduledRequest

NANOSERVE = str(Path(sys.executable).parent / 'nanoserve')


def outputs(engine, prompts, params):
    return [(o.token_ids, o.logprobs, o.text, o.finish_reason) for o in engine.generate(prompts, params,
                                                                                         use_tqdm=False)]


@pytest.fixture(scope='module')
def default_engines(default_model):
    kw = dict(dtype='bfloat16', max_batch_size=4, max_model_len=1024)
    return build_engine(default_model, **kw), build_engine(default_model, **kw, speculative='ngram')


@pytest.mark.parametrize('kind', ['extractive', 'code-edit', 'random'])
def test_greedy_output_unchanged_on_the_default_model(default_engines, kind):
    plain, spec = default_engines
    w = (make_workload(4, (32, 96), 48, plain.model.config.vocab_size, seed=1) if kind == 'random'
         else text_workload(kind, plain.tokenizer, 4, 96, seed=1))
    params = SamplingParams(max_tokens=w.output_len, temperature=0, logprobs=2)
    before, proposed = spec.scheduler.num_accepted_tokens, spec.scheduler.num_draft_tokens
    assert outputs(spec, w.prompts, params) == outputs(plain, w.prompts, params)
    assert spec.scheduler.num_draft_tokens > proposed                              # it did speculate: proposals checked
    if kind != 'random': assert spec.scheduler.num_accepted_tokens > before       # and kept


@pytest.mark.parametrize('extra', [{}, {'repetition_penalty': 1.1, 'presence_penalty': 0.5, 'min_tokens': 20}])
def test_seeded_sampled_output_unchanged_on_the_default_model(default_engines, extra):
    """Sampled requests speculate too: each position is drawn in order, with the request's own generator and the output
    before it, as a plain decode draws it, so a seeded request's tokens and logprobs are the plain engine's."""
    plain, spec = default_engines
    w = text_workload('extractive', plain.tokenizer, 4, 96, seed=5)
    before = spec.scheduler.num_accepted_tokens
    for seed in (1, 2):
        params = SamplingParams(max_tokens=96, temperature=0.7, top_p=0.95, seed=seed, logprobs=1, **extra)
        assert outputs(spec, w.prompts, params) == outputs(plain, w.prompts, params)
    assert spec.scheduler.num_accepted_tokens > before


def test_one_row_takes_the_decode_call_and_the_layers_agree(default_model):
    "Batch 1 through the decode call (each proposal a row), and through the layers' forward (--no-decode-call)."
    w = text_workload('extractive', build_engine(default_model, dtype='bfloat16').tokenizer, 2, 64)
    params = SamplingParams(max_tokens=64, temperature=0, logprobs=2)
    runs = {}
    for call in (True, False):
        for spec in ('none', 'ngram'):
            e = build_engine(default_model, dtype='bfloat16', max_batch_size=1, decode_call=call, speculative=spec)
            assert (e.runner.decode_call is not None) == call
            runs[call, spec] = outputs(e, w.prompts, params)
            if spec == 'ngram': assert e.scheduler.num_accepted_tokens > 0
    assert runs[True, 'ngram'] == runs[True, 'none'] and runs[False, 'ngram'] == runs[False, 'none']
    assert runs[True, 'none'] == runs[False, 'none']          # the decode call gives the layers' bits, logprobs too


def test_stop_strings_and_max_tokens_inside_accepted_proposals(default_engines):
    "A stop string or max_tokens reached in the middle of a step's accepted tokens ends the output where it would."
    plain, spec = default_engines
    w = text_workload('extractive', plain.tokenizer, 2, 80, seed=2)
    full = outputs(plain, w.prompts, SamplingParams(max_tokens=80, temperature=0))
    for p in (SamplingParams(max_tokens=80, temperature=0, stop=[full[0][2][30:36]]),
              SamplingParams(max_tokens=80, temperature=0, stop=[full[0][2][30:36]], include_stop_str_in_output=True),
              *(SamplingParams(max_tokens=n, temperature=0) for n in (1, 2, 7, 13))):
        assert outputs(spec, w.prompts, p) == outputs(plain, w.prompts, p), p


request = st.fixed_dictionaries({
    'prompt': st.lists(st.integers(3, 40), min_size=1, max_size=30),    # a small alphabet: n-grams recur
    'max_tokens': st.integers(1, 40),
    'arrive': st.integers(0, 10),
    'abort': st.one_of(st.none(), st.integers(1, 30)),
    'logprobs': st.sampled_from([None, 1]),
    'temperature': st.sampled_from([0.0, 0.9]),
    'seed': st.integers(0, 1000)})


@pytest.fixture(scope='module')
def tiny_engines(peaky):
    solo = Engine.build(peaky, max_batch_size=1, max_model_len=128, dtype='float32')
    # four rows over 12 blocks (192 tokens): a crowd preempts; every step's bookkeeping checked
    spec = Engine.build(peaky, max_batch_size=4, max_model_len=128, num_kv_blocks=12, dtype='float32',
                        check_invariants=True, speculative='ngram', num_speculative_tokens=3, ngram_min=1)
    return solo, spec


def crowd_with_aborts(eng, reqs: list[dict], params) -> list[tuple]:
    """Run `reqs` (each a dict with prompt, arrive and abort steps) through `eng` step by step: arrivals and aborts at
    their steps. (request id, index in reqs, its final output) for each request that was not aborted."""
    pending, ids, done, aborted, step = sorted(range(len(reqs)), key=lambda i: reqs[i]['arrive']), {}, {}, set(), 0
    while pending or eng.has_unfinished():
        while pending and reqs[pending[0]]['arrive'] <= step:
            i = pending.pop(0)
            ids[eng.add_request(reqs[i]['prompt'], params(reqs[i]))] = i
        for rid, i in ids.items():
            if reqs[i]['abort'] == step and eng.abort(rid): aborted.add(i)
        for o in eng.step(): done[o.request_id] = o
        step += 1
    return [(rid, i, done[rid]) for rid, i in ids.items() if i not in aborted]


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(request, min_size=1, max_size=8))
def test_tiny_crowd_with_aborts_and_preemption_equals_solo(tiny_engines, reqs):
    solo, eng = tiny_engines
    params = lambda r: SamplingParams(max_tokens=r['max_tokens'], temperature=r['temperature'], seed=r['seed'],
                                      ignore_eos=True, logprobs=r['logprobs'])
    for rid, i, out in crowd_with_aborts(eng, reqs, params):
        alone = solo.generate([reqs[i]['prompt']], params(reqs[i]), use_tqdm=False)[0]
        # the tokens: the tiny model's head size has no fixed-order attention kernel, so logprobs may differ in
        # their last bits between batch shapes, speculating or not (the default model's tests compare them exactly)
        assert out.token_ids == alone.token_ids, (i, reqs[i])
        assert (out.logprobs is None) == (reqs[i]['logprobs'] is None)
        if out.logprobs: assert [list(lp) for lp in out.logprobs] == [list(lp) for lp in alone.logprobs]
    assert eng.cache.pool.num_free == eng.cache.pool.num_blocks and not eng.cache.rows    # nothing leaked


def test_the_tiny_crowd_speculates_and_preempts(tiny_engines):
    "The examples above exercise what they claim: proposals accepted and rejected, and preemption."
    _, eng = tiny_engines
    s = eng.scheduler
    drafts, accepted, preempted = s.num_draft_tokens, s.num_accepted_tokens, s.num_preemptions
    rng = random.Random(1)
    prompts = [[rng.randint(3, 12) for _ in range(28)] for _ in range(6)]        # n-grams recur, continuations vary
    eng.generate(prompts, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), use_tqdm=False)
    assert 0 < s.num_accepted_tokens - accepted < s.num_draft_tokens - drafts and s.num_preemptions > preempted


def test_refusals(default_model):
    for kw, words in ((dict(speculative='eagle'), 'must be one of none, ngram'),
                      (dict(speculative='ngram', ngram_min=5, ngram_max=3), 'above ngram_max'),
                      (dict(speculative='ngram', num_speculative_tokens=0), 'positive integer'),
                      (dict(speculative='ngram', compile=True), 'not built yet')):
        with pytest.raises(ConfigError, match=words): EngineConfig(**kw)


def plain_and_speculating(model, msgs: list[dict], method: str) -> tuple[tuple, tuple]:
    """A real plain server and one with `--speculative METHOD`, each streaming a greedy chat completion of `msgs`
    through the openai client: (text, /health) of the plain one, (text, /health, /metrics) of the other."""
    got = []
    for flags in ((), ('--speculative', method)):
        with spawn_server(model, '--served-model-name', 'smol', '--max-batch-size', '2', *flags) as (url, _):
            client = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
            stream = client.chat.completions.create(model='smol', messages=msgs, max_tokens=48, temperature=0,
                                                    stream=True)
            text = ''.join(c.choices[0].delta.content or '' for c in stream if c.choices)
            got.append((text, httpx.get(url + '/health').json(), httpx.get(url + '/metrics').text))
    return got[0][:2], got[1]


def test_server_streams_the_same_text(default_model):
    "A real server with --speculative ngram streams, through the openai client, the text a plain server returns."
    msgs = [{'role': 'user', 'content': "Repeat this exactly: the quick brown fox jumps over the lazy dog, and the "
                                        "lazy dog sleeps while the quick brown fox jumps again."}]
    (plain, plain_health), (text, health, metrics) = plain_and_speculating(default_model, msgs, 'ngram')
    assert plain_health['speculative'] is None
    assert health['speculative'] == {'method': 'ngram', 'num_speculative_tokens': 8, 'ngram': [2, 4]}
    drafts = re.search(r'^vllm:spec_decode_num_draft_tokens_total\{model_name="smol"\} (\S+)$', metrics, re.M)
    accepted = re.search(r'^vllm:spec_decode_num_accepted_tokens_total\{model_name="smol"\} (\S+)$', metrics, re.M)
    assert 0 < float(accepted.group(1)) <= float(drafts.group(1))
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="smol",position="0"}' in metrics
    assert plain and plain == text


def test_bench_offline_reports_the_proposals(default_model, tmp_path):
    "`nanoserve bench offline --workload extractive --speculative ngram`: the acceptance line, and the CSV's columns."
    csv_path = tmp_path / 'offline.csv'
    done = subprocess.run([NANOSERVE, 'bench', 'offline', '--model', str(default_model), '--dtypes', 'bfloat16',
                           '--num-requests', '2', '--output-len', '48', '--batch1-requests', '1',
                           '--workload', 'extractive', '--speculative', 'ngram', '--csv', str(csv_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(open(csv_path)))
    assert all(int(r['accepted_tokens']) <= int(r['draft_tokens']) for r in rows)
    assert any(int(r['accepted_tokens']) > 0 for r in rows) and 'proposed tokens accepted' in done.stdout



def chi_square_ok(tokens: list[int], p: torch.Tensor) -> bool:
    "Whether `tokens` fit the distribution `p`: chi-square under df + 6 sqrt(2 df), cells under 5 expected pooled."
    counts = torch.bincount(torch.tensor(tokens), minlength=p.numel()).double()
    expected = len(tokens) * p.double()
    big = expected >= 5
    observed, wanted = torch.cat([counts[big], counts[~big].sum()[None]]), torch.cat([expected[big],
                                                                                     expected[~big].sum()[None]])
    chi2, df = float(((observed - wanted) ** 2 / wanted.clamp(min=1e-9)).sum()), int(big.sum())
    return chi2 < df + 6 * (2 * df) ** 0.5           # about 4 standard deviations: p < 1e-4, on fixed seeds


def test_checked_positions_follow_the_models_distribution(tiny_engines):
    """The runner's check of a request with proposals, over 4,000 seeds, on fixed logits: the first position's token
    follows softmax(logits[0]), and where it was the proposal, the second's follows softmax(logits[1]). A check that
    accepted a proposal without drawing, or drew the next position from a wrong distribution, fails."""
    _, eng = tiny_engines
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 40, generator=g) * 1.5
    logits[0, 7] = logits[0].max() + 1                   # the first proposal likely enough to be accepted often
    drafts = (7, 3, 9)
    firsts, seconds = [], []
    for seed in range(4000):
        req = SamplingParams(temperature=1.0, seed=seed, max_tokens=10, ignore_eos=True)
        state = SamplingState(req, torch.Generator().manual_seed(seed), [1, 2, 3], [])
        s = ScheduledRequest('r', 0, [3, *drafts], 3, state, drafts)
        out = eng.runner.check_proposals(logits, [s])
        firsts.append(out.token_ids[0])
        if out.token_ids[0] == drafts[0]: seconds.append(out.extra['r'][0][0])
        assert len(out.extra.get('r', [])) <= len(drafts)
    p0, p1 = logits[0].softmax(-1), logits[1].softmax(-1)
    assert chi_square_ok(firsts, p0) and len(seconds) > 500 and chi_square_ok(seconds, p1)
    assert not chi_square_ok([drafts[0]] * 4000, p0)    # the test sees a check that always accepts


def test_bench_serve_runs_the_extractive_workload_against_a_speculating_server(default_model, tmp_path):
    "`nanoserve bench serve --workload extractive`: chat asks ending at EOS, against `serve --speculative ngram`."
    out = tmp_path / 'out'
    done = subprocess.run([NANOSERVE, 'bench', 'serve', '--model', str(default_model), '--workload', 'extractive',
                           '--num-requests', '4', '--output-len', '96', '--rates', '', '--out', str(out), '--name',
                           'spec', '--serve-args', '--speculative ngram --max-batch-size 4', '--save-plan',
                           str(tmp_path / 'plan.json')], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(open(out / 'spec.csv')))
    assert [(r['mode'], r['completed'], r['failed']) for r in rows] == [('crowd', '4', '0')]
    plan = json.loads((tmp_path / 'plan.json').read_text())
    assert all(r['kind'] == 'chat' and not r['ignore_eos'] and 'word for word' in r['prompt'] for r in plan['requests'])


SCHEMA = {'type': 'object', 'required': ['colors'],
          'properties': {'colors': {'type': 'array', 'items': {'type': 'object', 'required': ['name', 'hex'],
                                                               'properties': {'name': {'type': 'string'},
                                                                              'hex': {'type': 'string'}}}}}}


def structured_cases():
    from nanoserve.grammar import Structured
    msgs = [[{'role': 'user', 'content': 'List three colors as JSON with fields name and hex, repeated twice.'}],
            [{'role': 'user', 'content': 'Say hello.'}]]
    return msgs, (Structured.json_schema(SCHEMA), Structured.regex('(the quick brown fox ){4}'))


@pytest.mark.parametrize('temperature', [0, 0.8])
def test_structured_output_speculates_and_is_unchanged(default_engines, temperature):
    """Requests with structured output speculate too: proposals cut at the first one the grammar does not allow, each
    position checked under the grammar after the proposals before it. Greedy and seeded sampled, the tokens and
    logprobs are the plain engine's, and the proposals were kept where the output repeats itself."""
    plain, spec = default_engines
    msgs, specs = structured_cases()
    s = spec.scheduler
    accepted = s.num_accepted_tokens
    for st in specs:
        params = SamplingParams(max_tokens=120, temperature=temperature, seed=3, structured=st, logprobs=1)
        assert outputs(spec, msgs, params) == outputs(plain, msgs, params)
    assert s.num_accepted_tokens > accepted


@pytest.mark.parametrize('persistent_batch', [None, True])
def test_the_capture_replays_plain_decodes_and_the_call_checks_proposals(default_model, persistent_batch):
    """`--cuda-graphs` on the CPU (the decode call as its recorder), with and without the persistent batch: plain decode
    steps replay through the capture, steps with proposals run through the decode call, and the greedy tokens and
    logprobs are the plain eager engine's."""
    kw = dict(dtype='bfloat16', max_batch_size=4, max_model_len=1024)
    plain = build_engine(default_model, **kw)
    spec = build_engine(default_model, **kw, bucket_decode=True, persist_inputs=True, capture_decode=True,
                        persistent_batch=persistent_batch, speculative='ngram', check_invariants=True)
    w = text_workload('extractive', plain.tokenizer, 4, 96, seed=2)
    params = SamplingParams(max_tokens=96, temperature=0, logprobs=1)
    assert outputs(spec, w.prompts, params) == outputs(plain, w.prompts, params)
    assert spec.decode_path.decode_steps > 0 and spec.scheduler.num_accepted_tokens > 0
    assert (spec.batch is not None) == bool(persistent_batch)
