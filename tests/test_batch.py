"Day 58, the persistent batch: random arrivals, lengths, aborts and preemptions against the invariants after every step and each request's solo run; and a mixed crowd through a real --cuda-graphs server that replays every decode step."
import pytest, torch
from hypothesis import given, settings, HealthCheck, strategies as st
from nanoserve.engine import Engine
from nanoserve.sampling import SamplingParams
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.loadgen import make_plan, spawn_server
from nanoserve.servebench import served_model
from holes import hole, scattered, SHORT, LONG
from nanoserve.graphbench import run_arm, check_same_answers, check_arm_replayed_every_step, check_arm_was_crowded, check_nothing_recorded_while_serving

request = st.fixed_dictionaries({
    'prompt': st.lists(st.integers(3, 300), min_size=1, max_size=40),
    'max_tokens': st.integers(1, 24),
    'arrive': st.integers(0, 12),                          # the step it is added before
    'abort': st.one_of(st.none(), st.integers(1, 30)),     # the step it is aborted before, if it is still running
    'temperature': st.sampled_from([0.0, 0.8]),
    'seed': st.integers(0, 1000)})

@pytest.fixture(scope='module')
def engines(peaky):
    path = peaky
    solo = Engine.build(path, max_batch_size=1, max_model_len=128, dtype='float32')   # token-for-token across batch shapes: float32
    # four rows over a pool of 12 blocks (192 tokens): small enough that a crowd preempts; capture on, so a scattered step would be counted
    crowd = build_engine(path, max_batch_size=4, max_model_len=128, num_kv_blocks=12, check_invariants=True, capture_recorder='host',
                         bucket_decode=True, persist_inputs=True, capture_decode=True, batch=PersistentBatch, device='cpu', dtype='float32')
    return solo, crowd

def solo_run(solo, r):
    return solo.generate([r['prompt']], SamplingParams(max_tokens=r['max_tokens'], temperature=r['temperature'], seed=r['seed'], ignore_eos=True),
                         use_tqdm=False)[0].token_ids

@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))   # the same 30 every run: CI must not draw a new example (1,500 random ones passed when written)
@given(st.lists(request, min_size=1, max_size=9))
def test_invariants_hold_and_outputs_equal_solo(engines, reqs):
    solo, eng = engines
    stats0, preempt0 = eng.decode_path.stats, eng.scheduler.num_preemptions
    pending, ids, done, aborted, step = sorted(range(len(reqs)), key=lambda i: reqs[i]['arrive']), {}, {}, set(), 0
    while pending or eng.has_unfinished():
        while pending and reqs[pending[0]]['arrive'] <= step:
            i = pending.pop(0); r = reqs[i]
            ids[eng.add_request(r['prompt'], SamplingParams(max_tokens=r['max_tokens'], temperature=r['temperature'], seed=r['seed'],
                                                            ignore_eos=True))] = i
        for rid, i in ids.items():
            if reqs[i]['abort'] == step and eng.abort(rid): aborted.add(i)         # False once it has finished
        for o in eng.step(): done[o.request_id] = o                    # check_invariants (rows 0..n-1 included) runs inside every step
        step += 1
    window = eng.decode_path.stats.since(stats0)
    assert window.scattered_calls == 0 and window.replays == window.decode_steps       # every decode step replayed
    for rid, i in ids.items():
        if i not in aborted: assert done[rid].token_ids == solo_run(solo, reqs[i]), (i, reqs[i])
    assert eng.cache.pool.num_free == eng.plan.num_blocks and not eng.cache.rows     # nothing leaked

def test_preemption_happens_in_these_examples(engines):
    "The pool is small enough to preempt: a crowd of long prompts does, and the invariants still hold."
    _, eng = engines
    before = eng.scheduler.num_preemptions
    outs = eng.generate([list(range(5, 45))] * 6, SamplingParams(max_tokens=20, ignore_eos=True), use_tqdm=False)
    assert eng.scheduler.num_preemptions > before and all(len(o.token_ids) == 20 for o in outs)

def test_mixed_crowd_replays_every_step_through_a_server(tiny):
    "A --cuda-graphs server (persistent batch on by default) replays every decode step of a mixed crowd, answering as eager does."
    # float32 on every machine: the two servers' answers are compared text for text, and bfloat16 (the default where the CPU has it)
    # rounds a crowd's decodes differently in a mixed step (one product of all its rows) than alone (the AMX kernel's), which a near-tie shows
    path, small = tiny('llama_tied_gqa'), ('--max-batch-size', '4', '--max-model-len', '256', '--dtype', 'float32')
    crowd = make_plan(12, (4, 12), (16, 64), seed=3)
    eager = run_arm('eager', small, [crowd], path)
    batched = run_arm('host', small + ('--cuda-graphs', '--capture-recorder', 'host'), [crowd], path)
    check_arm_was_crowded(batched); check_same_answers(eager, batched)
    check_arm_replayed_every_step(batched); check_nothing_recorded_while_serving(batched)
    assert batched.window.scattered_calls == 0 and batched.boot['persistent_batch'] is True

def test_a_hole_scatters_without_the_persistent_batch(tiny):
    """Without the persistent batch, a request that outlives the one below it decodes on over a hole in the rows (scattered
    steps); with it, it moves down and every step replays. A crowd leaves such holes where the order the server received it
    puts them; here the hole is made on cue (tests/holes.py). tests/test_capture.py shows the same in process."""
    path, small = tiny('llama_tied_gqa'), ('--max-batch-size', '4', '--max-model-len', '256', '--dtype', 'float32')
    host, texts = small + ('--cuda-graphs', '--capture-recorder', 'host'), []
    for args, batch in ((host + ('--no-persistent-batch',), False), (host, True)):
        with spawn_server(path, *args) as (url, _):
            got, before, after = hole(url, served_model(url))
        texts.append(got)
        assert after['cuda_graphs']['persistent_batch'] is batch
        assert scattered(before, after) >= LONG - SHORT if not batch else scattered(before, after) == 0
    assert texts[0] == texts[1]

def test_refusals(tiny):
    from nanoserve.core import ConfigError
    path = tiny('llama_tied_gqa')
    with pytest.raises(ConfigError, match="persistent_batch .* needs the persistent batch, and batch=None was passed"):
        build_engine(path, capture_recorder='host', bucket_decode=True, persist_inputs=True, capture_decode=True,
                     dtype='float32', batch=None)
    with pytest.raises(ConfigError, match="persistent_batch .* needs the persistent batch"):
        Engine.build(path, persistent_batch=True, dtype='float32')
    with pytest.raises(ValueError, match="mode must be 'eager' or 'lazy'"): PersistentBatch('sometimes')
    eng = Engine.build(path, persistent_batch=True, batch=PersistentBatch(), check_invariants=True, dtype='float32')   # the eager engine can keep it too
    assert len(eng.generate(['hello', 'abc'], SamplingParams(max_tokens=5), use_tqdm=False)) == 2
