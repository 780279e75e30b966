"""Day 06's fast layers against Day 05's reference layers: logits, greedy tokens on the default model in both dtypes, the
compiled decode taking the GEMV, and the flags that turn each change off."""
import json, subprocess, sys
from pathlib import Path
import pytest, torch
from nanoserve.engine import Engine, EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.model import load_model, DenseKV
from nanoserve.fast import speed_up, FastLinear, FusedAttention, amx_kernel
from nanoserve.elementwise import FastRMSNorm, elementwise_kernel
from nanoserve.sampling import SamplingParams
from forcing import forced_logprobs

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
PROMPTS = ['The capital of France is', 'def fibonacci(n):', 'Once upon a time, in a small village,', 'The three primary colors are']

def logits_of(model, ids, steps):
    "Prefill `ids` through DenseKV, then `steps` greedy one-row decodes: float32 logits [steps + 1, vocab]."
    kv, out, x, pos = DenseKV(model.config.num_hidden_layers), [], torch.tensor(ids), torch.arange(len(ids))
    with torch.inference_mode():
        for i in range(steps + 1):
            out.append(model.compute_logits(model(x, pos, kv.step([len(x)]))[-1:]))
            x, pos = out[-1].argmax(-1), torch.tensor([len(ids) + i])
    return torch.cat(out)

def assert_same_greedy(ref, other, params, n):
    "`other` engine's first n tokens of each of PROMPTS equal `ref`'s, as a batch of four and each prompt alone."
    want = [o.token_ids[:n] for o in ref.generate(PROMPTS, params, use_tqdm=False)]
    assert [o.token_ids[:n] for o in other.generate(PROMPTS, params, use_tqdm=False)] == want
    assert [other.generate([p], params, use_tqdm=False)[0].token_ids[:n] for p in PROMPTS] == want

TIE = 0.25    # nats: two tokens this close are a tie that the last bits of bfloat16's layers decide

FORCED = 64   # positions a prompt compared by teacher forcing
ALONE = 2     # prompts also run alone (one row a step: 64 steps each, where the batch of all takes 64 in all)

def gaps(a: list[list[dict]], b: list[list[dict]]) -> list[float]:
    "At every position of every prompt, the largest gap between two runs' logprobs of the tokens both list."
    return [max(abs(x[t] - y[t]) for t in x.keys() & y.keys()) for pa, pb in zip(a, b) for x, y in zip(pa, pb)]

@pytest.fixture(scope='module')
def f32_reference(default_model):
    """The default model in float32 through the plain layers (PyTorch's operators): the yardstick of the bfloat16 checks.
    Outside the batch-invariant mode, whose plain products pad a step to 64 rows (4 times slower here): its logprobs
    were within 4e-5 of the mode's on these prompts, and the bfloat16 gaps it measures are some 0.1."""
    return Engine.build(default_model, config=EngineConfig(dtype='float32', batch_invariant=False, **PLAIN))

def assert_teacher_forced_as_close(f32, ref, other, prompts=PROMPTS, forced=FORCED, ways=(True, False)):
    """bfloat16, by teacher forcing: `other` (a fast path) and `ref` (its reference) follow the float32 engine's greedy
    continuation of each prompt (`forced` tokens, every position compared; as a batch and the first ALONE prompts each
    alone, or the `ways` given), and `other`'s logprobs are about as far from float32's as `ref`'s are. The yardstick is bfloat16's
    own rounding as the reference shows it at every position: `other`'s mean gap within a quarter of `ref`'s, and its
    largest within twice `ref`'s largest (the worst position moves with the order of the sums, and one position can be
    a near-tie's)."""
    key = (tuple(prompts), forced)
    made = f32.__dict__.setdefault('forced_runs', {})                   # kept on the engines, made once a key
    if key not in made:            # a greedy run's own logprobs: those of its tokens forced through the same batch
        params = SamplingParams(temperature=0, max_tokens=forced, ignore_eos=True, logprobs=5)
        outs = f32.generate(prompts, params, use_tqdm=False)
        made[key] = [o.token_ids for o in outs], [o.logprobs for o in outs]
    seqs, want = made[key]
    mean = lambda e: sum(e) / len(e)
    for together in ways:
        n = len(prompts) if together else min(ALONE, len(prompts))
        mine = ref.__dict__.setdefault('forced_runs', {})
        if (key, together) not in mine:
            mine[key, together] = gaps(forced_logprobs(ref, prompts[:n], seqs[:n], together), want[:n])
        e_ref = mine[key, together]
        e_other = gaps(forced_logprobs(other, prompts[:n], seqs[:n], together), want[:n])
        assert len(e_other) == n * forced
        assert mean(e_other) <= 1.25 * mean(e_ref) and max(e_other) <= 2 * max(e_ref), (
            together, mean(e_other), mean(e_ref), max(e_other), max(e_ref))

@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_default_model_logits_match_the_reference_layers(default_model, dtype):
    ref, fast = load_model(default_model, dtype), speed_up(load_model(default_model, dtype), pack=True)
    assert isinstance(fast.model.layers[0].self_attn, FusedAttention) and isinstance(fast.lm_head, FastLinear)
    ids = [1, 504, 3575, 282, 4649, 314]
    if dtype == 'bfloat16':            # one-row products take the AMX kernel's dot products where it has them, which round apart from oneDNN's
        return assert_as_close_to_float32(load_model(default_model, 'float32'), ref, fast)
    a, b = logits_of(ref, ids, 6), logits_of(fast, ids, 6)
    assert ((a - b).abs().max() / a.abs().max()).item() < 1e-5
    assert (a.argmax(-1) == b.argmax(-1)).all()

@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_default_model_greedy_text_equals_the_reference(default_model, dtype, f32_reference):
    """A batch of four (fused GEMMs) and each prompt alone (one-row GEMVs): float32, the same greedy tokens as Day 05's
    layers; bfloat16, by teacher forcing, as close to float32 as they are at every position."""
    params = SamplingParams(temperature=0, max_tokens=24)
    ref = Engine.build(default_model, config=EngineConfig(dtype=dtype, fuse_projections=False, gemv=False, pack_weights=False, small_ops=False))
    fast = Engine.build(default_model, config=EngineConfig(dtype=dtype))
    assert ref.model.fast == {'fuse': False, 'one_row': False, 'pack': False, 'amx': False, 'small_ops': False,
                              'invariant': True}
    assert fast.model.fast == {'fuse': True, 'one_row': True, 'pack': True, 'amx': amx_kernel() is not None,
                               'small_ops': True, 'invariant': True}
    assert fast.model.lm_head.is_packed and ref.model.lm_head.weight is ref.model.model.embed_tokens.weight
    assert (fast.model.lm_head.packed is None) == fast.model.lm_head.invariant     # own kernel only: no oneDNN
    # float32: every token. bfloat16 rounds differently per product shape (a fused GEMM, AMX's tiles, a float32-accumulating GEMV),
    # and a near-tie flips some way into a sentence: held to float32 at every position of the same sequence instead.
    if dtype == 'float32': assert_same_greedy(ref, fast, params, 24)
    else: assert_teacher_forced_as_close(f32_reference, ref, fast)

def test_compiled_decode_of_the_fast_layers_matches_the_reference(peaky):
    "The compile recorder traces the fast layers (the GEMV at one row) into its graph; its tokens equal the reference layers' eager ones."
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 9, 17], [3, 4, 5, 6, 7]]
    ref = Engine.build(peaky, config=EngineConfig(dtype='float32', fuse_projections=False, gemv=False, pack_weights=False))
    want = [[o.token_ids for o in ref.generate([p], params, use_tqdm=False)] for p in prompts]
    cfg = EngineConfig(dtype='float32', bucket_decode=True, persist_inputs=True, capture_decode=True, max_batch_size=2,
                       warm_width=128, capture_recorder='compile')
    eng = build_engine(peaky, cfg, batch=PersistentBatch)
    got = [[o.token_ids for o in eng.generate([p], params, use_tqdm=False)] for p in prompts]
    assert got == want
    s = eng.decode_path.stats
    assert s.replays == s.decode_steps > 0 and s.captures >= 1

def test_speed_up_refuses_other_settings_on_the_same_model(tiny):
    m = speed_up(load_model(tiny('llama_tied_gqa')), True, True, True)
    with pytest.raises(ValueError, match='already sped up'): speed_up(m, True, True, False)
    assert speed_up(m, True, True, True) is m

def test_flags_turn_each_change_off(tiny):
    "`--no-fuse-projections --no-gemv --no-pack-weights --no-amx-linear --no-small-ops` are flags of generate; the text is the same either way (float32, a peaky-enough prompt)."
    path = str(tiny('llama_tied_gqa'))
    run = lambda *f: json.loads(subprocess.run([NANOSERVE, 'generate', '--model', path, '--json', '--dtype', 'float32', '--max-tokens', '8', *f, 'hello'],
                                               capture_output=True, text=True, check=True).stdout)
    a, b = run(), run('--no-fuse-projections', '--no-gemv', '--no-pack-weights', '--no-amx-linear', '--no-small-ops')
    assert a['token_ids'] == b['token_ids'] if 'token_ids' in a else a == b

@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_decode_kernel_greedy_text_equals_sdpa(default_model, dtype, f32_reference):
    "Day 12's C decode kernel against gather + SDPA (`--no-decode-kernel`), its reference: a batch of four and each prompt alone."
    from nanoserve.attention import decode_kernel, decode_kernel_error
    assert decode_kernel() is not None, decode_kernel_error()          # CI has the C compiler Inductor needs: the kernel is built
    params = SamplingParams(temperature=0, max_tokens=24)
    ref = Engine.build(default_model, config=EngineConfig(dtype=dtype, decode_kernel=False))
    ker = Engine.build(default_model, config=EngineConfig(dtype=dtype))
    assert not ref.runner.decode_kernel and ker.runner.decode_kernel
    # float32: every token. bfloat16: the kernel keeps the softmax's weights in float32 where SDPA rounds them to bfloat16 (Day 12
    # checks the kernel is the closer of the two to float64), and a near-tie flips one of these prompts at its 4th token: by teacher forcing
    if dtype == 'float32': assert_same_greedy(ref, ker, params, 24)
    else: assert_teacher_forced_as_close(f32_reference, ref, ker)
    # on two threads (CI's suite runs on one), each prompt alone is one row on two threads: the kernel splits its query heads
    # across them (the sixteenth pass), and still gives SDPA's text
    n = torch.get_num_threads(); torch.set_num_threads(2)
    try:
        if dtype == 'float32': assert_same_greedy(ref, ker, params, 24)
        else: assert_teacher_forced_as_close(f32_reference, ref, ker, ways=(False,))     # alone: one row on two threads
    finally: torch.set_num_threads(n)

LONG = ' '.join(['The history of the river valley begins with the first farmers, who'] * 8)     # about 100 tokens

def test_prefill_kernel_greedy_text_equals_sdpa(default_model, f32_reference):
    """Day 11's prefill attention (AMX's tiles, or AVX512-BF16's dot products) against SDPA (`--no-prefill-kernel`), its reference, in bfloat16 on the default model: the kernel
    runs in the prefill (the profiler names it: the shared order's `token_attention` where it applies, as on every CPU with
    either, else the chunk kernel), as close to float32 as SDPA by teacher forcing (a batch of four and two prompts
    alone, and a 100-token prompt prefilled whole and in 16-token chunks), and the first step's top logprobs within TIE of SDPA's.
    The batch-invariant mode (the default here) attends every token in the decode rows' order: these leave it."""
    from torch.profiler import profile, ProfilerActivity
    from nanoserve.prefill_kernel import prefill_kernel, prefill_kernel_error, tile_order_applies
    from nanoserve.fast import bf16_isa
    if bf16_isa() is None: pytest.skip('the kernel is for CPUs with AMX or AVX512-BF16')
    assert prefill_kernel() is not None, prefill_kernel_error()
    ref = Engine.build(default_model, config=EngineConfig(dtype='bfloat16', prefill_kernel=False,
                                                          batch_invariant=False))
    ker = Engine.build(default_model, config=EngineConfig(dtype='bfloat16', batch_invariant=False))
    assert not ref.runner.prefill_kernel and ker.runner.prefill_kernel
    with profile(activities=[ProfilerActivity.CPU]) as prof: ker.generate([LONG], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    cfg = ker.model.config
    shared = tile_order_applies(torch.bfloat16, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    name = 'nanoserve::token_attention_kernel' if shared else 'nanoserve::prefill_attention'
    assert any(e.key == name for e in prof.key_averages())
    assert_teacher_forced_as_close(f32_reference, ref, ker)
    chunked = Engine.build(default_model, config=EngineConfig(dtype='bfloat16', max_num_batched_tokens=16,
                                                              max_mixed_batched_tokens=16, batch_invariant=False))
    assert_teacher_forced_as_close(f32_reference, ref, chunked, prompts=[LONG, PROMPTS[0] + LONG])
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    for a, b in zip(ref.generate(PROMPTS + [LONG], params, use_tqdm=False), ker.generate(PROMPTS + [LONG], params, use_tqdm=False)):
        want, got = a.logprobs[0], b.logprobs[0]
        assert max(abs(got[t] - want[t]) for t in set(want) & set(got)) < TIE, (want, got)

@pytest.mark.parametrize('flag,dtype', [('--no-decode-kernel', 'float32'), ('--no-decode-call', 'bfloat16'), ('--no-prefill-kernel', 'bfloat16')])
def test_flag_reaches_generate(tiny, flag, dtype):
    "`--no-decode-kernel`, `--no-decode-call` and `--no-prefill-kernel` are flags of generate, and the tokens are the same either way."
    path = str(tiny('llama_tied_gqa'))
    run = lambda *f: json.loads(subprocess.run([NANOSERVE, 'generate', '--model', path, '--json', '--dtype', dtype, '--max-tokens', '12', *f, 'hello'],
                                               capture_output=True, text=True, check=True).stdout)
    a, b = run(), run(flag)
    assert a['token_ids'] == b['token_ids'] if 'token_ids' in a else a == b

def forced_logits(model, ids, follow):
    "Prefill `ids` through DenseKV, then one-row decodes of the tokens `follow` (the same inputs whatever the model picks): float32 logits [len(follow) + 1, vocab]."
    kv, out, x, pos = DenseKV(model.config.num_hidden_layers), [], torch.tensor(ids), torch.arange(len(ids))
    with torch.inference_mode():
        for i in range(len(follow) + 1):
            out.append(model.compute_logits(model(x, pos, kv.step([len(x)]))[-1:]).float())
            if i < len(follow): x, pos = torch.tensor([follow[i]]), torch.tensor([len(ids) + i])
    return torch.cat(out)

def assert_as_close_to_float32(f32, ref, other, steps=12):
    """Two bfloat16 models that round apart (sums in other orders): each against the float32 model, on float32's greedy tokens.
    `other`'s logits are no farther from float32's than `ref`'s are (the largest error over the steps, with a quarter's margin), and
    wherever float32's two best tokens are more than TIE apart, both pick float32's."""
    ids = [1, 504, 3575, 282, 4649, 314]
    want = logits_of(f32, ids, steps)
    follow = want.argmax(-1)[:-1].tolist()
    err = lambda m: (lambda l: ((l - want).abs().amax(-1) / want.abs().amax(-1)).max().item())(forced_logits(m, ids, follow))
    e_ref, e_other = err(ref), err(other)
    assert e_other <= 1.25 * e_ref, (e_other, e_ref)
    top2 = want.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > TIE
    for m in (ref, other): assert (forced_logits(m, ids, follow).argmax(-1) == want.argmax(-1))[clear].all()

def assert_same_float32_model(ref, other, tol=1e-5):
    "Two float32 engines' models, rounding apart: logits through Day 05's DenseKV within `tol` of the largest, the same argmax, and every greedy token, batched and alone."
    ids = [1, 504, 3575, 282, 4649, 314]
    a, b = logits_of(ref.model, ids, 6), logits_of(other.model, ids, 6)
    assert ((a - b).abs().max() / a.abs().max()).item() < tol and (a.argmax(-1) == b.argmax(-1)).all()
    assert_same_greedy(ref, other, SamplingParams(temperature=0, max_tokens=24), 24)

def test_amx_products_greedy_text_equals_onednn(default_model, f32_reference):
    "Day 06's bfloat16 kernel (decodes, up to 32 rows; AMX's tiles, or AVX512-BF16's dot products) against oneDNN's packed product (`--no-amx-linear`), bfloat16, the default model."
    if amx_kernel() is None: pytest.skip("this CPU has neither AMX nor AVX512-BF16: the kernel is not used here, and oneDNN is the engine's product")
    ref = Engine.build(default_model, config=EngineConfig(dtype='bfloat16', amx_linear=False))
    amx = Engine.build(default_model, config=EngineConfig(dtype='bfloat16'))
    assert not ref.model.fast['amx'] and ref.model.lm_head.amx is None and amx.model.fast['amx'] and amx.model.lm_head.amx is not None
    # both sum in float32 and round once. Past 4 rows the tiles give oneDNN's bits here; up to 4, the dot products sum in another
    # order, and 30 layers of bfloat16 carry their last bits on: as close to float32 as oneDNN, at every forced position
    assert_as_close_to_float32(f32_reference.model, ref.model, amx.model)
    assert_teacher_forced_as_close(f32_reference, ref, amx)

def test_f32_products_greedy_text_equals_onednn(default_model):
    "Day 06's float32 kernel (decodes, up to 32 rows, AVX-512 or AVX2) against oneDNN's packed product (`--no-amx-linear`), float32, the default model: every token."
    from nanoserve.f32_linear import f32_kernel
    if f32_kernel() is None: pytest.skip('this CPU has neither AVX-512F nor AVX2: the float32 kernel is not used here, and oneDNN is the engine\'s product')
    ref = Engine.build(default_model, config=EngineConfig(dtype='float32', amx_linear=False))
    ker = Engine.build(default_model, config=EngineConfig(dtype='float32'))
    assert ref.model.lm_head.f32 is None and ker.model.lm_head.f32 is not None
    assert ker.model.model.layers[0].mlp.down_proj.f32 is not None
    # a 6-row prefill and one-row decodes through the kernel; float32 sums in two orders (its runs of 64, oneDNN's blocks)
    assert_same_float32_model(ref, ker)

@pytest.mark.parametrize('dtype', ['bfloat16', 'float32'])
def test_small_ops_greedy_text_equals_pytorch_operators(default_model, dtype, f32_reference):
    "Day 06's small operators in C (RMSNorm, rotary, SiLU-times-up) against PyTorch's (`--no-small-ops`), the default model, in both dtypes."
    if elementwise_kernel() is None: pytest.skip('no C compiler: the small operators are PyTorch\'s here')
    ref = Engine.build(default_model, config=EngineConfig(dtype=dtype, small_ops=False))
    fast = Engine.build(default_model, config=EngineConfig(dtype=dtype))
    assert isinstance(fast.model.model.norm, FastRMSNorm) and not isinstance(ref.model.model.norm, FastRMSNorm)
    # bfloat16: the same roundings as PyTorch's but for RMSNorm's sum (and SiLU's exponential, from another library). One rounding that
    # flips early grows through 30 bfloat16 layers: with the dot products' bits (a CPU without AMX) the two models' logits came 1.5% of
    # the largest apart, though each was as close to float32's as the other. So each is held to float32's at every forced position.
    # float32: within a few ulps (the same two differences), so every token
    if dtype == 'bfloat16':
        assert_as_close_to_float32(f32_reference.model, ref.model, fast.model)
        assert_teacher_forced_as_close(f32_reference, ref, fast)
    else: assert_same_float32_model(ref, fast)

def counting(runner):
    "Count the steps `runner` gives to its Day 13 decode call that the call takes (it answers None for the others): the runner calls `run`."
    call, taken = runner.decode_call, []
    run = call.run
    def spy(rows, tokens, context_lens, argmax=False, adapters=None):
        out = run(rows, tokens, context_lens, argmax, adapters)
        if out is not None: taken.append(len(rows))
        return out
    call.run = spy
    return taken

@pytest.mark.parametrize('dtype', ['bfloat16', 'float32'])
def test_decode_call_gives_the_layers_tokens_and_logprobs(default_model, dtype):
    "Day 13's one-call decode against the layers' forward (`--no-decode-call`), the default model, in both dtypes: the same bits, so every token and logprob."
    from nanoserve.f32_linear import f32_kernel
    if dtype == 'bfloat16' and amx_kernel() is None: pytest.skip("this CPU has neither AMX nor AVX512-BF16: a bfloat16 decode step is not one call here (Day 13's decode_call_refusal)")
    if dtype == 'float32' and f32_kernel() is None: pytest.skip("this CPU has neither AVX-512F nor AVX2: a float32 decode step is not one call here (Day 13's decode_call_refusal)")
    ref = Engine.build(default_model, config=EngineConfig(dtype=dtype, decode_call=False))
    one = Engine.build(default_model, config=EngineConfig(dtype=dtype))
    assert ref.runner.decode_call is None and one.runner.decode_call_off is None, one.runner.decode_call_off
    taken = counting(one.runner)
    for params in (SamplingParams(temperature=0, max_tokens=24, logprobs=3), SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=24, logprobs=1)):
        want, got = ref.generate(PROMPTS, params, use_tqdm=False), one.generate(PROMPTS, params, use_tqdm=False)
        assert [o.token_ids for o in got] == [o.token_ids for o in want] and [o.logprobs for o in got] == [o.logprobs for o in want]
        # alone, against the layers alone: a one-row product takes Day 06's dot products, which round apart from the tiles of four rows
        alone = lambda e: [e.generate([p], params, use_tqdm=False)[0] for p in PROMPTS]
        a, b = alone(one), alone(ref)
        assert [o.token_ids for o in a] == [o.token_ids for o in b] and [o.logprobs for o in a] == [o.logprobs for o in b]
    assert len(taken) >= 4 * 23 and 4 in taken and 1 in taken       # decodes of the batch of four and of each prompt alone went through it

def test_decode_call_argmax_serves_greedy_rows_not_grammar_rows(default_model, monkeypatch):
    "Day 18 hands a greedy decode step to Day 13's `run` with the argmax computed in C (Day 14's `rows_argmax` is not called again), and not a step whose row has a grammar, whose argmax must be of the masked logits."
    from nanoserve.f32_linear import f32_kernel
    from nanoserve.grammar import Structured
    import nanoserve.sampling as S
    if f32_kernel() is None: pytest.skip("this CPU has neither AVX-512F nor AVX2: a float32 decode step is not one call here (Day 13's decode_call_refusal)")
    path = default_model                     # the tiny models' head size (8) has no decode-attention kernel, so no call
    eng, ref = Engine.build(path, config=EngineConfig(dtype='float32')), Engine.build(path, config=EngineConfig(dtype='float32', decode_call=False))
    assert eng.runner.decode_call is not None, eng.runner.decode_call_off
    calls, real = [], S.rows_argmax
    monkeypatch.setattr(S, 'rows_argmax', lambda x: calls.append(len(x)) or real(x))
    taken = counting(eng.runner)
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = eng.generate([[5, 6, 7]], plain, use_tqdm=False)[0]
    assert len(taken) == 11 and calls == [1]              # 11 decodes through the call, whose argmax served them; only the prefill asked Day 14
    assert got.token_ids == ref.generate([[5, 6, 7]], plain, use_tqdm=False)[0].token_ids
    calls.clear(); taken.clear()
    shaped = SamplingParams(temperature=0, max_tokens=12, structured=Structured.json_schema({'type': 'object'}))
    got = eng.generate([[5, 6, 7]], shaped, use_tqdm=False)[0]
    assert len(taken) >= 1 and len(calls) == len(taken) + 1      # a grammar's row: Day 14's argmax of the masked logits at every step
    assert got.token_ids == ref.generate([[5, 6, 7]], shaped, use_tqdm=False)[0].token_ids
def test_decode_call_is_off_where_it_does_not_apply(tiny):
    """The runner says why it runs the layers: float32 products by oneDNN, the batch-invariant mode's padding, the flag,
    the decode kernel off; and each still generates."""
    path = tiny('llama_tied_gqa')
    padded = EngineConfig(dtype='bfloat16', batch_invariant=True, pack_weights=False)   # no kernels: every step padded
    for cfg, says in ((EngineConfig(dtype='float32', amx_linear=False), 'float32 kernel'), (padded, 'pads every step'),
                      (EngineConfig(dtype='bfloat16', decode_call=False), 'turned off'), (EngineConfig(dtype='bfloat16', decode_kernel=False), 'decode kernel')):
        eng = Engine.build(path, config=cfg)
        assert eng.runner.decode_call is None and says in eng.runner.decode_call_off, (cfg, eng.runner.decode_call_off)
        assert len(eng.generate(['hello'], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0].token_ids) == 4

PLAIN = dict(fuse_projections=False, gemv=False, pack_weights=False, amx_linear=False, small_ops=False,
             decode_call=False)

@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_qwen3_fast_paths_on_equal_off(tiny, dtype):
    """A tiny Qwen3 (an RMSNorm on each q and k head, a query width twice the hidden width): every fast path on
    (fused projections, the GEMV, packed products through nanoserve's kernels, the small operators, the decode call)
    gives the plain layers' greedy tokens, as a batch of four and each prompt alone, in float32; in bfloat16 it is as
    close to the float32 plain layers as the bfloat16 plain layers are, at every position of the same forced sequence."""
    from nanoserve.decode_call import decode_call_refusal
    path = tiny('qwen3')
    ref = Engine.build(path, config=EngineConfig(dtype=dtype, **PLAIN))
    fast = Engine.build(path, config=EngineConfig(dtype=dtype))
    assert not any(ref.model.fast[k] for k in ('fuse', 'one_row', 'pack', 'small_ops'))
    attn = fast.model.model.layers[0].self_attn
    assert isinstance(attn, FusedAttention)
    assert isinstance(attn.q_norm, FastRMSNorm) and isinstance(attn.k_norm, FastRMSNorm)
    assert ref.model.model.layers[0].self_attn.q_norm is not None
    # the decode call takes the q/k norms: where this CPU runs the call for the dtype, the runner uses it
    applies = decode_call_refusal(fast.model, fast.runner.cache) is None
    assert (fast.runner.decode_call is not None) == applies, fast.runner.decode_call_off
    taken = counting(fast.runner) if applies else None
    if dtype == 'float32': assert_same_greedy(ref, fast, SamplingParams(temperature=0, max_tokens=24), 24)
    else: assert_teacher_forced_as_close(Engine.build(path, config=EngineConfig(dtype='float32', **PLAIN)), ref, fast)
    assert taken is None or (4 in taken and 1 in taken)

ARMS = {'compile': dict(compile=True),
        'capture': dict(bucket_decode=True, persist_inputs=True, capture_decode=True, warm_width=128)}

@pytest.mark.parametrize('arm', list(ARMS))
def test_qwen3_compiled_and_captured_decode_equal_the_plain_layers(tiny, arm):
    """A tiny Qwen3 through `--compile` (the fast layers, q/k norms included, traced by torch.compile) and through the
    CPU's capture (`--cuda-graphs`: its default recorder here, the decode call where it applies): the plain layers'
    greedy tokens (float32), as a batch of four and each prompt alone."""
    path = tiny('qwen3')
    ref = Engine.build(path, config=EngineConfig(dtype='float32', **PLAIN))
    eng = build_engine(path, EngineConfig(dtype='float32', max_batch_size=4, **ARMS[arm]), batch=PersistentBatch)
    assert_same_greedy(ref, eng, SamplingParams(temperature=0, max_tokens=16), 16)
    if arm == 'capture': assert eng.decode_path.stats.replays > 0
