"""Prefix caching (Day 9): outputs do not change when it is on, a shared prefix is computed once, and the pool's bookkeeping holds under
random prefixes, aborts, eviction and preemption."""
import contextlib, io, json, random, re
import httpx, pytest, torch
from hypothesis import given, settings, strategies as st, HealthCheck
from nanoserve.engine import Engine
from nanoserve.kvcache import check_invariants
from nanoserve.loadgen import spawn_server
from nanoserve.sampling import SamplingParams
from nanoserve.tiny import tiny_checkpoint

def conversations(system: list[int], n: int, turns: int, rng: random.Random) -> list[list[int]]:
    "Token-id prompts of `n` conversations of `turns` turns, turn t extending turn t-1, all starting with `system`; turn-major order."
    convs = [[list(system)] for _ in range(n)]
    for _ in range(turns - 1):
        for c in convs: c.append(c[-1] + [rng.randrange(3, 300) for _ in range(rng.randint(3, 20))])
    return [c[t] + [rng.randrange(3, 300)] for t in range(turns) for c in convs]

def run(path, prompts, params, prefix_cache: bool, **kw):
    e = Engine.build(path, dtype='float32', prefix_cache=prefix_cache, check_invariants=True, **kw)
    return [o.token_ids for o in e.generate(prompts, params, use_tqdm=False)], e

@pytest.mark.parametrize('sampling', ['greedy', 'seeded'])
def test_outputs_equal_on_and_off_over_a_multi_turn_plan(peaky, sampling):
    rng = random.Random(0)
    prompts = conversations([rng.randrange(3, 300) for _ in range(40)], 4, 3, rng)
    params = [SamplingParams(max_tokens=8, temperature=0) if sampling == 'greedy' else SamplingParams(max_tokens=8, temperature=0.9, seed=i)
              for i in range(len(prompts))]
    on, eng = run(peaky, prompts, params, True, max_batch_size=4)
    off, _ = run(peaky, prompts, params, False, max_batch_size=4)
    assert on == off
    s = eng.snapshot()
    assert s.prefix_cache_hits >= 8 * 32, s            # later turns found at least the shared system prompt's two blocks each

def test_default_model_outputs_equal_on_and_off(default_model):
    system = {'role': 'system', 'content': 'You are a concise assistant. Answer in one short sentence, and name the city when asked about a country.'}
    turns = ['What is the capital of France?', 'And of Italy?', 'Which of the two is larger?']
    chats, history = [], [system]
    for i, q in enumerate(turns):
        history = history + [{'role': 'user', 'content': q}]
        chats.append(list(history)); history = history + [{'role': 'assistant', 'content': f'An answer, number {i}.'}]
    chats += [[system, {'role': 'user', 'content': q}] for q in turns]
    for params in (SamplingParams(max_tokens=12, temperature=0), [SamplingParams(max_tokens=12, temperature=0.8, seed=i) for i in range(len(chats))]):
        on, eng = run(default_model, chats, params, True, max_batch_size=2)
        off, _ = run(default_model, chats, params, False, max_batch_size=2)
        assert on == off
        assert eng.snapshot().prefix_cache_hits > 0

def test_a_shared_512_token_prefix_is_computed_once():
    path = tiny_checkpoint(max_position_embeddings=1024)
    rng = random.Random(1)
    prefix = [rng.randrange(3, 300) for _ in range(512)]
    first, second = prefix + [rng.randrange(3, 300) for _ in range(20)], prefix + [rng.randrange(3, 300) for _ in range(20)]
    one = SamplingParams(max_tokens=1, temperature=0)
    for on in (True, False):
        e = Engine.build(path, dtype='float32', prefix_cache=on, max_model_len=1024, check_invariants=True)
        e.generate([first], one, use_tqdm=False)
        before = e.snapshot().num_computed_tokens
        out = e.generate([second], one, use_tqdm=False)[0]
        computed = e.snapshot().num_computed_tokens - before
        assert (out.num_cached_tokens, computed) == ((512, 20) if on else (0, 532))

def drive(path, prompts, abort_at: dict, prefix_cache: bool):
    "Run `prompts` through a small pool (12 blocks of 4 tokens: eviction and preemption), aborting request ids at chosen steps; check the counts every step."
    e = Engine.build(path, dtype='float32', prefix_cache=prefix_cache, block_size=4, num_kv_blocks=12, max_model_len=40,
                     max_batch_size=4, max_num_batched_tokens=16, check_invariants=True)
    for i, p in enumerate(prompts): e.add_request(p, SamplingParams(max_tokens=6, temperature=0), request_id=f'r{i}')
    done, step = {}, 0
    while e.has_unfinished():
        step += 1
        for rid, at in abort_at.items():
            if at == step: e.abort(rid)
        for o in e.step():
            if o.finished: done[o.request_id] = o.token_ids
        held = {}
        for table in e.cache.block_tables.values():
            for b in table: held[b] = held.get(b, 0) + 1
        assert all(e.cache.pool.ref_counts[b] == held.get(b, 0) for b in range(e.cache.pool.num_blocks))   # a count per holder
        assert all(e.cache.pool.ref_counts[b] == 0 for b in e.cache.pool.free_blocks)                    # free blocks are held by nobody
    check_invariants(e.cache)
    assert e.cache.pool.num_free == e.cache.pool.num_blocks
    return done, e

def shared_prompts(seed: int, n: int) -> list[list[int]]:
    "n prompts, each one of three shared prefixes (4-14 tokens) and a tail of its own (2-12 tokens)."
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 300) for _ in range(rng.randint(4, 14))] for _ in range(3)]
    return [rng.choice(prefixes) + [rng.randrange(3, 300) for _ in range(rng.randint(2, 12))] for _ in range(n)]

@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), n=st.integers(4, 12), aborts=st.lists(st.tuples(st.integers(0, 11), st.integers(1, 12)), max_size=3))
def test_refcounts_hold_and_outputs_match_under_eviction_preemption_and_aborts(peaky, seed, n, aborts):
    prompts, abort_at = shared_prompts(seed, n), {f'r{i}': step for i, step in aborts if i < n}
    on, _ = drive(peaky, prompts, abort_at, True)
    off, _ = drive(peaky, prompts, abort_at, False)
    kept = [f'r{i}' for i in range(n) if f'r{i}' not in abort_at]
    assert {r: on[r] for r in kept} == {r: off[r] for r in kept}

def test_the_small_pool_does_evict_and_preempt(peaky):
    "The property above runs where it matters: this pool and these prompts make the cache evict names and the scheduler preempt."
    _, e = drive(peaky, shared_prompts(0, 12), {}, True)
    assert e.cache.prefix.evictions > 0 and e.scheduler.num_preemptions > 0 and e.cache.prefix.hits > 0

def test_counters_count_each_request_once_and_read_through_an_empty_index(peaky):
    e = Engine.build(peaky, dtype='float32', check_invariants=True)
    e.generate([[5, 6, 7, 8, 9, 10]], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    s = e.snapshot()
    assert len(e.cache.prefix) == 0 and (s.prefix_cache_queries, s.prefix_cache_hits) == (6, 0)   # nothing named, the query still counted
    prompts = shared_prompts(0, 12)
    _, e = drive(peaky, prompts, {}, True)
    assert e.scheduler.num_preemptions > 0 and e.cache.prefix.queries == sum(len(p) for p in prompts)   # readmissions not counted again

def test_generate_takes_no_prefix_cache(peaky):
    from nanoserve.cli import main
    outs = []
    for flags in ([], ['--no-prefix-cache']):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(['generate', '--model', str(peaky), '--dtype', 'float32', '--max-tokens', '4', '--json', *flags,
                         'the capital of France', 'the capital of France is']) == 0
        outs.append([json.loads(l)['token_ids'] for l in buf.getvalue().splitlines()])
    assert outs[0] == outs[1]

def test_server_reports_cached_tokens_in_usage_and_metrics(tiny):
    system = 'the capital of France is Paris ' * 8
    def ask(url, q):
        r = httpx.post(f'{url}/v1/completions', json={'model': 'tiny', 'max_tokens': 2, 'temperature': 0, 'prompt': system + q}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()['usage']['prompt_tokens_details']['cached_tokens']
    def metric(url, name):
        return float(re.search(rf'^{re.escape(name)}{{model_name="tiny"}} ([0-9.e+]+)$', httpx.get(f'{url}/metrics').text, re.M).group(1))
    path = tiny('llama_tied_gqa')
    with spawn_server(path, '--dtype', 'float32', '--served-model-name', 'tiny') as (url, _):
        assert httpx.get(f'{url}/health').json()['prefix_cache'] is True
        assert ask(url, 'hello') == 0
        cached = ask(url, 'hello world')
        assert cached > 0 and cached % 16 == 0
        assert metric(url, 'vllm:prefix_cache_hits_total') == cached and metric(url, 'vllm:prefix_cache_queries_total') > cached
    with spawn_server(path, '--dtype', 'float32', '--served-model-name', 'tiny', '--no-prefix-cache') as (url, _):
        assert httpx.get(f'{url}/health').json()['prefix_cache'] is False
        assert ask(url, 'hello') == ask(url, 'hello world') == 0
