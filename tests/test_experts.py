"""Mixtures of experts (Qwen3-MoE, Mixtral, OLMoE): the engine's fast paths token for token with transformers in float32
and close in bfloat16; the grouped expert products bit for bit the per-expert path; seeded answers the same alone and in
a crowd (bit for bit, bfloat16, int8 and int4 experts); a quantized load that reads each weight as it quantizes it gives
the full load's bits; an MoE checkpoint nanoserve cannot serve refused before any weight is read, from the command line
too; a real server answers the openai client. (Float32 parity with the fast paths off, and tensor parallelism, are in
test_parity.py and test_parallel.py.)"""
import json, subprocess, sys
from pathlib import Path
import openai, pytest, torch, transformers
from nanoserve.core import ConfigError
from nanoserve.engine import Engine, EngineConfig
from nanoserve.experts import SparseMoE
from nanoserve.fast import amx_kernel, speed_up
from nanoserve.grouped_experts import group_experts
from nanoserve.integer import integer_refusal
from nanoserve.launch import build_engine, check_recorder_takes
from nanoserve.loadgen import spawn_server
from nanoserve.model import load_model, DenseKV
from nanoserve.quant import quantize_model
from nanoserve.sampling import SamplingParams
from nanoserve.weights import weight_bytes

MOE_KINDS = ('qwen3_moe', 'mixtral', 'olmoe')
NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
OFF = dict(fuse_projections=False, pack_weights=False, small_ops=False, gemv=False, decode_kernel=False,
           prefill_kernel=False)

def prompts(vocab: int, seed: int = 0, lens=(20, 33, 41, 25, 60, 18)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]

def moe_layers(model) -> list[SparseMoE]: return [m for m in model.modules() if isinstance(m, SparseMoE)]

@pytest.mark.parametrize('kind', MOE_KINDS)
def test_engine_fast_paths_greedy_32_tokens_match_transformers(tiny, kind):
    "Float32, the engine as `nanoserve generate` builds it (fused, packed, small kernels) and with all of that off."
    path = tiny(kind)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ps = prompts(hf.config.vocab_size, seed=2, lens=(5, 17, 40))
    want = [hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=32,
                        do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in ps]
    greedy = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    for flags in ({}, OFF):
        engine = build_engine(str(path), EngineConfig(dtype='float32', max_num_batched_tokens=16, **flags))
        assert moe_layers(engine.model)
        assert [o.token_ids for o in engine.generate(ps, greedy, use_tqdm=False)] == want, flags
    assert len({tuple(w) for w in want}) > 1

@pytest.mark.parametrize('kind', MOE_KINDS)
def test_bfloat16_is_close_to_transformers_float32(tiny, kind):
    "Not token-exact (bfloat16 rounds), but the next-token distributions stay close, the grouped products in."
    path = tiny(kind)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = build_engine(str(path), EngineConfig(dtype='bfloat16'))
    model, ids = engine.model, torch.tensor(prompts(hf.config.vocab_size)[4])
    if amx_kernel() is not None: assert all(m.grouped is not None for m in moe_layers(model))
    with torch.inference_mode():
        got = model.compute_logits(model(ids, torch.arange(len(ids)), DenseKV(3).step([len(ids)])))
        want = hf(ids[None]).logits[0].float()
    assert (got.softmax(-1) - want.softmax(-1)).abs().max() < 0.03

@pytest.mark.parametrize('mode', ['none', 'int8', 'int4', 'w8a8', 'w4a8'])
def test_grouped_expert_products_equal_the_per_expert_path_bit_for_bit(tiny, mode):
    "The expert kernel's reference check: the whole model's logits over a prefill and a decode batch, grouped or not."
    if mode in ('w8a8', 'w4a8') and (why := integer_refusal(mode)): pytest.skip(why)
    if mode not in ('w8a8', 'w4a8') and amx_kernel() is None: pytest.skip("no bfloat16 kernel (AMX or AVX512-BF16)")
    cfg = EngineConfig(dtype='bfloat16', quantization=mode)
    engine = build_engine(str(tiny('olmoe')), cfg, quantize=quantize_model)
    model, layers = engine.model, moe_layers(engine.model)
    assert all(m.grouped is not None for m in layers)
    ids = torch.tensor(prompts(320)[4])
    def logits():
        with torch.inference_mode():
            prefill = model.compute_logits(model(ids, torch.arange(len(ids)), DenseKV(3).step([len(ids)])))
            kv = DenseKV(3, num_seqs=5)
            model(ids[:20], torch.arange(4).repeat(5), kv.step([4] * 5))
            decode = model.compute_logits(model(ids[20:25], torch.full((5,), 4), kv.step([1] * 5)))
        return prefill, decode
    grouped = logits()
    for m in layers: m.grouped = None
    plain = logits()
    assert all(torch.equal(a, b) for a, b in zip(grouped, plain))

def seeded(engine, ps, params):
    return [(o.token_ids, o.logprobs) for o in engine.generate(ps, params, use_tqdm=False)]

@pytest.mark.parametrize('mode', ['bfloat16', 'float32', 'int8', 'int4'])
def test_seeded_answers_alone_equal_a_crowd_bit_for_bit(tiny, mode):
    """A crowd of 6 seeded requests under a 16-token budget (prefills chunked where the crowd puts them, decodes beside
    prefills), against each alone: the same tokens and logprobs."""
    path = str(tiny('qwen3_moe'))
    dtype = 'float32' if mode == 'float32' else 'bfloat16'
    quant = mode if mode.startswith('int') else 'none'
    cfg = dict(dtype=dtype, quantization=quant, max_num_batched_tokens=16, max_model_len=256)
    ps = prompts(320)
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i, max_tokens=12, logprobs=2) for i in range(6)]
    engine = build_engine(path, EngineConfig(**cfg), quantize=quantize_model)
    assert engine.runner.batch_invariant
    crowd = seeded(engine, ps, params)
    assert max(engine.snapshot().steps_by_batch) >= 4                      # requests ran together
    alone = [seeded(engine, [p], [sp])[0] for p, sp in zip(ps, params)]
    assert crowd == alone

def test_a_quantized_load_reads_each_weight_as_it_quantizes_it(tiny):
    "The deferred load holds no full-width product weight, and its int4 and int8 models give the full load's bits."
    path = tiny('mixtral')
    deferred = load_model(path, 'bfloat16', defer_products=True)
    metas = [n for n, p in deferred.named_parameters() if p.is_meta]
    assert len(metas) == 3 * 4 * 3 + 4 * 3                                # experts' and attention's, every layer
    assert weight_bytes(deferred) < weight_bytes(load_model(path, 'bfloat16')) / 2
    ps = prompts(320)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for mode in ('int8', 'int4'):
        engine = build_engine(str(path), EngineConfig(dtype='bfloat16', quantization=mode), quantize=quantize_model)
        assert not any(p.is_meta for p in engine.model.parameters()) and engine.model.deferred is None
        # the full load, sped up and quantized as the engine's loader did before it deferred anything
        q = lambda m: quantize_model(m, mode)
        full = speed_up(load_model(path, 'bfloat16'), True, True, True, True, True, True, release=True, quantize=q)
        group_experts(full)
        eager = Engine.build(full, tokenizer=engine.tokenizer, dtype='bfloat16', quantization=mode)
        assert seeded(engine, ps, greedy) == seeded(eager, ps, greedy)

def shared_expert_checkpoint(path: Path, **fields) -> Path:
    "A config of a mixture nanoserve cannot serve, beside a weights file that is not safetensors at all."
    path.mkdir()
    cfg = dict(architectures=['DeepseekV3ForCausalLM'], vocab_size=320, hidden_size=64, intermediate_size=128,
               moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2) | fields
    (path/'config.json').write_text(json.dumps(cfg))
    (path/'model.safetensors').write_bytes(b'not a checkpoint: reading it would fail with another error')
    return path

def test_unservable_mixtures_are_refused_before_any_weight_is_read(tmp_path):
    deepseek = shared_expert_checkpoint(tmp_path/'deepseek')
    with pytest.raises(ConfigError, match=r'DeepseekV3ForCausalLM is a mixture of experts with shared experts '
                                          r'\(n_shared_experts=1\); nanoserve serves the mixtures Qwen3MoeForCausalLM'):
        Engine.build(deepseek)
    sigmoid = shared_expert_checkpoint(tmp_path/'sigmoid', architectures=['Qwen3MoeForCausalLM'], n_shared_experts=0,
                                       num_experts=8, scoring_func='sigmoid')
    with pytest.raises(ConfigError, match="scoring_func='sigmoid'.*nanoserve's router is a softmax"):
        Engine.build(sigmoid)
    r = subprocess.run([NANOSERVE, 'generate', '--model', str(deepseek), 'hi'], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and 'DeepseekV3ForCausalLM is a mixture of experts with shared experts' in r.stderr

def test_cuda_graphs_are_refused_for_a_mixture(tiny):
    model = load_model(tiny('olmoe'), 'float32')
    with pytest.raises(ConfigError, match='OlmoeForCausalLM is a mixture of experts.*cannot record; serve it without'):
        check_recorder_takes('cuda_graph', model)
    check_recorder_takes('compile', model)                                 # the CPU's recorders take it

def test_server_answers_the_openai_client(tiny):
    "`nanoserve serve` on a Mixtral checkpoint, int8 experts, the real client: a completion and a seeded repeat."
    with spawn_server(str(tiny('mixtral')), '--dtype', 'bfloat16', '--quantization', 'int8') as (url, _):
        client = openai.OpenAI(base_url=f'{url}/v1', api_key='x')
        ask = lambda: client.completions.create(model=client.models.list().data[0].id, prompt='hello world',
                                                max_tokens=8, temperature=0.7, seed=3)
        first = ask()
        assert first.usage.completion_tokens == 8 and first.choices[0].finish_reason == 'length'
        assert ask().choices[0].text == first.choices[0].text
