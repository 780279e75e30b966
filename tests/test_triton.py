"""The card's path on the CPU: the engine's steps with nanoserve's Triton kernels (paged attention from the slot table,
the KV write, RMSNorm with its residual, the rotary embedding, SiLU-times-up, the fixed-order products) run in Triton's
interpreter, the way a CUDA device runs them compiled. What a card adds (speed, its warps' reduction order) waits for
one: `tests/test_cuda.py` and `bench/gpu/run.sh`. Each case shows its kernels ran (`LAUNCHES`)."""
import pytest, torch
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.sampling import SamplingParams
from nanoserve.core import HostSyncs
from nanoserve.triton_kernels import interpreted_on_cpu, interpreting, triton_error, LAUNCHES

pytestmark = pytest.mark.skipif(not interpreting(), reason=f"needs Triton's interpreter: {triton_error() or 'off'}")

# the card's path takes the engine's unpacked products (the CPU's packing and C kernels are its own)
CARD = dict(max_batch_size=4, max_model_len=128, pack_weights=False, decode_call=False)
PROMPTS = ['hello world ' * 6 + 'hello', 'hello world ' * 6 + 'world', 'world']     # two share a block: a prefix hit
KERNELS = ('paged_attention', 'store_kv', 'rms_norm', 'rope_', 'silu_mul', 'fixed_linear')

def test_card_path_gives_the_pytorch_logprobs(peaky):
    """Greedy tokens through every Triton kernel (float32) equal PyTorch's own path, and every top logprob to float32's
    rounding (a key missed or misread moves them by far more), prefix hits, chunked prefill and decodes included;
    every kernel ran."""
    greedy = SamplingParams(max_tokens=6, temperature=0, logprobs=4, ignore_eos=True)
    plain = build_engine(str(peaky), EngineConfig(**CARD, dtype='float32', batch_invariant=False, decode_kernel=False,
                                                  prefill_kernel=False, small_ops=False), batch=PersistentBatch)
    want = plain.generate(PROMPTS, greedy, use_tqdm=False)
    before = LAUNCHES.copy()
    with interpreted_on_cpu():
        card = build_engine(str(peaky), EngineConfig(**CARD, dtype='float32', max_num_batched_tokens=16),
                            batch=PersistentBatch)
        got = card.generate(PROMPTS, greedy, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    pairs = [(a, b) for x, y in zip(got, want) for a, b in zip(x.logprobs, y.logprobs)]
    assert pairs and all(a.keys() == b.keys() for a, b in pairs)
    assert max(abs(a[t] - b[t]) for a, b in pairs for t in a) < 1e-4
    ran = LAUNCHES - before
    assert all(ran[k] > 0 for k in KERNELS), ran
    assert card.snapshot().prefix_cache_hits > 0
    assert card.runner.invariance['how'] == 'fixed-order kernels', card.runner.invariance

def test_card_path_is_batch_invariant(tiny):
    """bfloat16 on the card's path, the batch-invariant mode on by itself: a seeded request's tokens and logprobs are the
    same bits alone and in a crowd of others (its prefill chunked differently, its decodes beside other rows)."""
    seeded = SamplingParams(max_tokens=6, temperature=0.9, seed=7, logprobs=3, ignore_eos=True)
    other = SamplingParams(max_tokens=9, temperature=0.7, seed=1, ignore_eos=True)
    with interpreted_on_cpu():
        engine = build_engine(str(tiny('llama_tied_gqa')), EngineConfig(**CARD, dtype='bfloat16',
                              max_num_batched_tokens=24), batch=PersistentBatch)
        assert engine.runner.batch_invariant and engine.runner.invariance['how'] == 'fixed-order kernels'
        alone = engine.generate([PROMPTS[0]], [seeded], use_tqdm=False)[0]
        crowd = engine.generate(PROMPTS + [PROMPTS[0]], [other, other, other, seeded], use_tqdm=False)[-1]
    assert alone.token_ids == crowd.token_ids
    assert alone.logprobs == crowd.logprobs

def test_the_card_path_needs_the_interpreter_where_there_is_no_card(monkeypatch):
    "Asked for without the interpreter, the card's path on the CPU is refused with what to set."
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    with pytest.raises(RuntimeError, match='TRITON_INTERPRET=1'):
        with interpreted_on_cpu(): pass

def steps_under_the_check(engine, params) -> tuple[list, list]:
    """Each step of `params`' requests under its own `HostSyncs`: (syncs, read-backs, whether it gave tokens) a step,
    and the requests' outputs."""
    for i, p in enumerate(PROMPTS): engine.add_request(p, params, request_id=f'r{i}')
    seen, done = [], {}
    while engine.has_unfinished():
        with HostSyncs() as check: outs = engine.step()
        seen.append((check.syncs, check.read_backs, bool(outs)))
        done |= {o.request_id: o for o in outs if o.finished}
    return seen, [done[f'r{i}'] for i in range(len(PROMPTS))]

def test_a_card_step_reads_the_device_once_and_its_recording_gives_its_bits(tiny):
    """Every step of the card's path (prefill chunks, decodes, eager or replayed through the persistent buffers as a
    CUDA graph would be, the card's sampler with logprobs) reads the device once: its read-back, nothing before it.
    And the recorded decode's form (the pool read-only, each row's own K/V beside it, the KV write for every layer in
    one launch) gives the eager card step's tokens and logprobs, bit for bit."""
    params = SamplingParams(max_tokens=5, temperature=0.8, seed=2, logprobs=2, top_p=0.9, ignore_eos=True)
    capture = dict(bucket_decode=True, persist_inputs=True, capture_decode=True, capture_recorder='host', warm_rows=4)
    results = []
    with interpreted_on_cpu():
        for flags in ({}, capture):
            engine = build_engine(str(tiny('llama_tied_gqa')), EngineConfig(**CARD, dtype='bfloat16', **flags,
                                  max_num_batched_tokens=16), batch=PersistentBatch)
            engine.runner.sample_on_device = True              # the card's sampler, as a CUDA engine takes it
            results.append(steps_under_the_check(engine, params))
    assert engine.decode_path.stats.replays > 0
    for seen, _ in results:
        # a step that only prefills part of a prompt samples nothing, and reads nothing back
        assert len(seen) > 5 and all(syncs == {} and backs == int(gave) for syncs, backs, gave in seen), seen
    (_, eager), (_, recorded) = results
    assert [(o.token_ids, o.logprobs) for o in eager] == [(o.token_ids, o.logprobs) for o in recorded]

def test_the_check_sees_a_read_before_the_read_back(tiny):
    "The CPU's own step checks its slot mapping with a read (free there): the check names it, so it is not blind."
    engine = build_engine(str(tiny('llama_tied_gqa')), EngineConfig(**CARD, dtype='bfloat16'), batch=PersistentBatch)
    seen, _ = steps_under_the_check(engine, SamplingParams(max_tokens=2, ignore_eos=True))
    assert any('nanoserve.attention.build_metadata' in site for syncs, _, _ in seen for site in syncs), seen
