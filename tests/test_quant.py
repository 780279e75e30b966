"""Day 60, quantized weights: each layer against its float reference within a bound derived from the quantization step, a tiny model end to
end in each mode (offline and through the server, with its resident weight bytes on /health), the default model answering "Paris" in each
mode, and the refusals."""
import json, subprocess, sys
from pathlib import Path
import httpx, openai, pytest, torch
from nanoserve.core import ConfigError
from nanoserve.engine import Engine
from nanoserve.launch import build_engine
from nanoserve.loadgen import spawn_server
from nanoserve.quant import (Int8Linear, Int4Linear, quantize_int8, dequantize_int8, quantize_int4, dequantize_int4, quantize_model,
                             group_size_for)
from nanoserve.sampling import SamplingParams
from nanoserve.weights import weight_bytes

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')

@pytest.mark.parametrize('rows', [1, 7, 32])
@pytest.mark.parametrize('group', [32, 64, 128])
@pytest.mark.parametrize('act', [torch.float32, torch.bfloat16])
def test_layers_against_float_reference(rows, group, act):
    """|y - x Wᵀ| <= Σ_k |x_k| · step_ik / 2 (each weight is off by at most half its step) + 2⁻⁷ · (|x| |W|ᵀ + |y|) (bfloat16 rounding of the
    activations, of the scales and of the result): the bound a weight-only quantized product can promise, checked element by element."""
    g = torch.Generator().manual_seed(rows * 1000 + group)
    w = torch.randn(48, 256, generator=g) * torch.rand(48, 1, generator=g) * 3
    b = torch.randn(48, generator=g)
    x = torch.randn(rows, 256, generator=g).to(act)
    exact = x.float() @ w.T + b
    slack = 2 ** -7 * (x.float().abs() @ w.abs().T + exact.abs())
    q, s = quantize_int8(w)
    y8 = Int8Linear(w, b)(x)
    assert y8.dtype == act and ((y8.float() - exact).abs() <= x.float().abs() @ (s[:, None].expand(-1, 256) / 2).T + slack).all()
    q4, s4, z4 = quantize_int4(w, group)
    y4 = Int4Linear(w, b, group)(x)
    assert y4.dtype == act and ((y4.float() - exact).abs() <= x.float().abs() @ (s4.repeat_interleave(group, 1) / 2).T + slack).all()
    assert (dequantize_int8(q, s) - w).abs().max() <= s.max() / 2 + 1e-6 and (dequantize_int4(q4, s4, z4, group) - w).abs().max() <= s4.max() / 2 + 1e-5

@pytest.mark.parametrize('mode', ['int8', 'int4'])
def test_tiny_model_end_to_end(peaky, mode):
    "A quantized tiny model through the offline engine: batched, chunked prefill, its weights smaller; both keep the peaky model's greedy tokens."
    prompts, sp = [[5, 6, 7, 8], list(range(40, 100)), [9] * 12], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    kw = dict(dtype='bfloat16', max_batch_size=4, max_num_batched_tokens=32)
    plain = build_engine(peaky, **kw)
    quant = build_engine(peaky, **kw, quantization=mode, quantize=quantize_model)
    want, got = [o.token_ids for o in plain.generate(prompts, sp, use_tqdm=False)], [o.token_ids for o in quant.generate(prompts, sp, use_tqdm=False)]
    assert [len(t) for t in got] == [16] * 3 and quant.model.quantization == mode
    assert weight_bytes(quant.model) < weight_bytes(plain.model)
    assert got == want                      # the peaky model's logits are far apart: int8's and int4's rounding flips none

def test_server_reports_quantized_weight_bytes(peaky):
    with spawn_server(peaky, '--dtype', 'bfloat16', '--served-model-name', 'tiny', '--quantization', 'int8') as (url, _):
        h = httpx.get(url + '/health').json()['weights']
        r = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0).completions.create(model='tiny', prompt='hello', max_tokens=8, temperature=0)
    plain = build_engine(peaky, dtype='bfloat16')
    assert h['quantization'] == 'int8' and h['bytes'] < weight_bytes(plain.model) and r.choices[0].finish_reason in ('length', 'stop')

@pytest.mark.parametrize('mode', ['none', 'int8', 'int4'])
def test_default_model_answers_paris(default_model, mode):
    r = subprocess.run([NANOSERVE, 'generate', '--model', str(default_model), '--chat', '--json', '--max-tokens', '24', '--quantization', mode,
                        'What is the capital of France? Answer in one sentence.'],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'Paris' in json.loads(r.stdout.splitlines()[-1])['text']

def test_default_group_size_divides_every_layer(default_model):
    from nanoserve.model import load_model
    m = load_model(default_model)
    assert group_size_for(m) == 64                      # 576 = 9 x 64: 128 does not divide SmolLM2's hidden state

def test_refusals(tiny, default_model):
    path = tiny('llama_tied_gqa')
    with pytest.raises(ConfigError, match='quantize=nanoserve.quant.quantize_model'):
        build_engine(path, quantization='int8', quantize=None)
    with pytest.raises(ConfigError, match='Engine.build assembles the eager engine only'): Engine.build(path, quantization='int4')
    with pytest.raises(ConfigError, match='must be none, int8, int4, w8a8 or w4a8'): build_engine(path, quantization='int5', quantize=quantize_model)
    with pytest.raises(ConfigError, match='32, 64, 128 or 256'): build_engine(path, quantization='int4', quant_group_size=48, quantize=quantize_model)
    m = build_engine(path, dtype='bfloat16', quantization='int8', quantize=quantize_model).model
    with pytest.raises(ConfigError, match='already quantized'): quantize_model(m, 'int4')
    for flags, fragment in ((['--quantization', 'int3'], 'must be none, int8, int4, w8a8 or w4a8'),
                            (['--quantization', 'int4', '--quant-group-size', '128', '--tensor-parallel-size', '3'], 'choose a --quant-group-size')):
        r = subprocess.run([NANOSERVE, 'generate', '--model', str(default_model), *flags, 'hi'], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and fragment in r.stderr, r.stderr

@pytest.mark.parametrize('mode', ['int8', 'int4'])
def test_recorded_decode_over_quantized_layers(peaky, mode):
    "The CPU capture (compile recorder, Day 54) records decodes over the quantized layers and replays them: the tokens of the eager engine."
    from nanoserve.batch import PersistentBatch
    sp, prompts = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), [[5, 6, 7], [8, 9, 10, 11], [40, 41]]
    kw = dict(dtype='bfloat16', quantization=mode, quantize=quantize_model, max_batch_size=2, max_model_len=128)
    eager = build_engine(peaky, **kw)
    captured = build_engine(peaky, **kw, bucket_decode=True, persist_inputs=True, capture_decode=True, batch=PersistentBatch)
    assert [o.token_ids for o in captured.generate(prompts, sp, use_tqdm=False)] == [o.token_ids for o in eager.generate(prompts, sp, use_tqdm=False)]
    stats = captured.decode_path.stats
    assert stats.replays > 0 and stats.replays == stats.decode_steps and captured.boot.warm
    assert captured.boot.recorder == 'compile'       # head size 8: no decode call, so the CPU's other recorder

@pytest.fixture(scope='module')
def peaky_wide(tmp_path_factory):
    "A peaky tiny model (see conftest) whose 2-rank shards split into int4 groups of 32: 8 heads of 8, an MLP 256 wide."
    import transformers
    from conftest import TINY, CORPUS
    from nanoserve.tiny import tiny_checkpoint, CHAT_SPECIALS
    path = tiny_checkpoint(tmp_path_factory.mktemp('peaky_wide'), 3, corpus=CORPUS, special_tokens=CHAT_SPECIALS, perturb=True,
                           **{**TINY, 'intermediate_size': 256}, num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad(): model.model.norm.weight.mul_(12)
    model.save_pretrained(path)
    return path

@pytest.mark.parametrize('mode', ['int8', 'int4'])
def test_quantized_shards_equal_one_process(peaky_wide, mode):
    """Each rank quantizes its own shard as it loads (the worker finds Day 60's function by the name rank 0 sends): the greedy tokens of one
    quantized process, chunked prefill included, and each rank holding half of the quantized decoder (int4's groups split with the rows and
    columns, so the shards hold exactly the single process's codes; int8's row-parallel layers get one scale per rank's half-row)."""
    prompts, sp = [[5, 6, 7, 8, 9, 10], [100, 200, 33], list(range(40, 110)), [3] * 20], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    kw = dict(dtype='float32', max_batch_size=4, max_num_batched_tokens=32, quantization=mode, quantize=quantize_model,
              quant_group_size=32 if mode == 'int4' else None)
    one = build_engine(peaky_wide, **kw)
    two = build_engine(peaky_wide, **kw, tensor_parallel_size=2)
    try:
        assert [o.token_ids for o in two.generate(prompts, sp, use_tqdm=False)] == [o.token_ids for o in one.generate(prompts, sp, use_tqdm=False)]
        r0, r1 = two.model.tensor_parallel.weight_bytes
        replicated = ('norm.weight', 'o_proj.scales', 'down_proj.scales')
        every = sum(p.numel() * p.element_size() for n, p in one.model.named_parameters() if n.endswith(replicated))
        # int8 in the int8 product's layout: a row-parallel layer's scales (float32, its outputs padded to 16) are its
        # layout's head, on every rank
        every += sum(4 * ((m.out_features + 15) // 16 * 16) for n, m in one.model.named_modules()
                     if n.endswith(('o_proj', 'down_proj')) and getattr(m, 'q8', None) is not None)
        half = (weight_bytes(one.model) - every) // 2 + every           # norms and int8's row scales on every rank
        # int4 in nanoserve's layout: each rank's columns padded to blocks of 32, a 64-byte head a layer: about half
        assert r0 == r1 and two.model.quantization == mode
        assert r0 == half if mode == 'int8' else half <= r0 <= 1.03 * half
    finally: two.close()

def test_quantized_shards_through_the_command(peaky_wide):
    "`generate --tensor-parallel-size 2 --quantization int4`: the tokens of the same command in one process."
    run = lambda *flags: subprocess.run([NANOSERVE, 'generate', '--model', str(peaky_wide), '--dtype', 'float32', '--json', '--max-tokens', '12',
                                         '--quantization', 'int4', '--quant-group-size', '32', *flags, 'hello world', 'abc'],
                                        capture_output=True, text=True, timeout=600)
    one, two = run(), run('--tensor-parallel-size', '2')
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-1500:], two.stderr[-1500:])
    assert [json.loads(l)['token_ids'] for l in two.stdout.splitlines()] == [json.loads(l)['token_ids'] for l in one.stdout.splitlines()]

@pytest.mark.parametrize('mode', ['int8', 'int4'])
@pytest.mark.parametrize('pack', [True, False])
def test_quantized_products_of_both_kernels_within_the_bound(mode, pack):
    """nanoserve's product (the layer's `q8` or `q4`, where this CPU has the kernel) and PyTorch's (pack=False): each
    within the bound, and the weight held once."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(80, 256, generator=g) * 2, torch.randn(80, generator=g)
    x = torch.randn(20, 256, generator=g).bfloat16()
    layer = Int8Linear(w, b, pack=pack) if mode == 'int8' else Int4Linear(w, b, 64, pack=pack)
    own, torch_copy = (layer.q8, layer.qweight) if mode == 'int8' else (layer.q4, layer.packed)
    if pack and own is None:
        pytest.skip("this CPU has no bfloat16 dot products: nanoserve's quantized products are not built here")
    assert (own is None) == (not pack) and (torch_copy is None) == pack          # one copy of the weight, not two
    exact = x.float() @ w.T + b
    if mode == 'int8': step = quantize_int8(w)[1][:, None].expand(-1, 256)
    else: step = quantize_int4(w, 64)[1].repeat_interleave(64, 1)
    bound = x.float().abs() @ (step / 2).T + 2 ** -7 * (x.float().abs() @ w.abs().T + exact.abs())
    assert ((layer(x).float() - exact).abs() <= bound).all()

@pytest.mark.parametrize('model_kind', ['llama_untied_mha', 'qwen3'])
@pytest.mark.parametrize('mode,kind', [('int8', 'q8'), ('int4', 'q4')])
def test_quantized_decode_call_gives_the_layers_tokens_and_logprobs(tiny, mode, kind, model_kind):
    """A bfloat16 model with int8 or int4 layers takes the decode call (its layers' products through nanoserve's
    quantized kernel, the LM head through the bfloat16 one): greedy and seeded tokens and logprobs equal to the
    quantized layers' own forward, step for step. Qwen3's q/k norms stay float, as every norm does."""
    from nanoserve.fast import amx_kernel
    if amx_kernel() is None:
        pytest.skip("this CPU has no bfloat16 dot products: no quantized product kernel and no bfloat16 decode call "
                    "here")
    path = tiny(model_kind)                 # head sizes 16 and 32: the decode-attention kernel has a version for each
    kw = dict(dtype='bfloat16', quantization=mode, quantize=quantize_model, max_batch_size=4, max_model_len=256,
              quant_group_size=32 if mode == 'int4' else None)
    call, layers = build_engine(path, **kw), build_engine(path, **kw, decode_call=False)
    assert call.runner.decode_call is not None and call.runner.decode_call.quant == kind, call.runner.decode_call_off
    assert layers.runner.decode_call is None
    if model_kind == 'qwen3':
        attn = call.model.model.layers[0].self_attn
        assert type(attn.q_norm).__name__ == 'FastRMSNorm' and attn.q_norm.weight.dtype == torch.bfloat16
    prompts = [[5, 6, 7], list(range(10, 60)), [9] * 12, [40, 41]]
    params = [SamplingParams(max_tokens=20, temperature=t, seed=i, logprobs=2, ignore_eos=True)
              for i, t in enumerate((0, 0.8, 0, 1.0))]
    got, want = call.generate(prompts, params, use_tqdm=False), layers.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.logprobs for o in got] == [o.logprobs for o in want]
