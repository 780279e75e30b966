"""Day 67, integer products (--quantization w8a8 and w4a8): the layers against their integer reference bit for bit, tiny models end to end
(offline, through the decode call, the CPU capture and a real server), the default model answering "Paris" in each mode, and the refusals.
On a CPU without AVX512-VNNI the modes are refused, and that refusal is what runs here."""
import json, subprocess, sys
from pathlib import Path
import httpx, openai, pytest, torch, transformers
from conftest import TINY, TINY_KINDS, CORPUS
from nanoserve.core import ConfigError
from nanoserve.integer import a8_isa, int8_kernel, w8a8_reference, w4a8_reference, w4a8_pack
from nanoserve.launch import build_engine
from nanoserve.loadgen import spawn_server
from nanoserve.quant import W8A8Linear, W4A8Linear, quantize_int8, quantize_int4, quantize_model
from nanoserve.sampling import SamplingParams
from nanoserve.tiny import tiny_checkpoint, CHAT_SPECIALS
from nanoserve.weights import weight_bytes

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
MODES = ['w8a8', 'w4a8']
needs_vnni = pytest.mark.skipif(a8_isa() is None or int8_kernel() is None,
                                reason="no AVX512-VNNI here: the integer modes are refused (test_refused_without_vnni)")

def wide_tiny(path: Path, kind: str, peaky: bool = False) -> Path:
    "A tiny checkpoint of `kind` whose every layer input is a multiple of 64 (an MLP 256 wide); `peaky`: its logits far apart."
    arch, extra = TINY_KINDS[kind]
    tiny_checkpoint(path, 3, corpus=CORPUS, special_tokens=CHAT_SPECIALS, arch=arch, perturb=True,
                    **{**TINY, 'intermediate_size': 256}, **extra)
    if peaky:
        model = transformers.AutoModelForCausalLM.from_pretrained(path)
        with torch.no_grad(): model.model.norm.weight.mul_(12)
        model.save_pretrained(path)
    return path

@pytest.fixture(scope='module')
def wide(tmp_path_factory):
    made = {}
    def get(kind: str, peaky: bool = False) -> Path:
        if (kind, peaky) not in made: made[kind, peaky] = wide_tiny(tmp_path_factory.mktemp(kind), kind, peaky)
        return made[kind, peaky]
    return get

@needs_vnni
@pytest.mark.parametrize('rows', [1, 4, 5, 31])
@pytest.mark.parametrize('threads', [1, 3])
def test_layers_equal_their_integer_reference(rows, threads):
    """Each layer's forward (its own packed copy, a bias, bfloat16 and float32 out; 100 outputs, so the last block is
    narrow and masked) equals the PyTorch reference over the same codes, bit for bit, on 1 thread and on 3 (the blocks
    and panels split); and so does the build without tiles, called directly."""
    from nanoserve.integer import integer_product, w8a8_pack
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(100, 384, generator=g) * 0.1, torch.randn(100, generator=g)
    x = torch.randn(rows, 384, generator=g).bfloat16()
    q, s = quantize_int8(w)
    q4, s4, z4 = quantize_int4(w, 64)
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.equal(W8A8Linear(w, b)(x), w8a8_reference(x, q, s, b))
        assert torch.equal(W8A8Linear(w, b, wide=True)(x), w8a8_reference(x, q, s, b, wide=True))
        assert torch.equal(W4A8Linear(w, b, 64)(x), w4a8_reference(x, q4, s4, z4, 64, b))
        assert torch.equal(W4A8Linear(w, b, 64, wide=True)(x), w4a8_reference(x, q4, s4, z4, 64, b, wide=True))
        dots = int8_kernel(tiles=False)
        assert torch.equal(integer_product('w8a8_linear', x, w8a8_pack(q, s), b, 100, lib=dots), w8a8_reference(x, q, s, b))
        assert torch.equal(integer_product('w4a8_linear', x, w4a8_pack(q4, s4, z4, 64), b, 100, lib=dots),
                           w4a8_reference(x, q4, s4, z4, 64, b))
    finally: torch.set_num_threads(was)

@needs_vnni
@pytest.mark.parametrize('mode', MODES)
def test_tiny_model_end_to_end(wide, mode):
    """A peaky tiny model through the offline engine, batched and chunked: its weights smaller, its greedy tokens those of the weight-only
    mode over the same codes (int8, int4 in groups of 32: the activations' rounding flips none of the peaky model's tokens)."""
    path = wide('llama_tied_gqa', peaky=True)
    prompts, sp = [[5, 6, 7, 8], list(range(40, 100)), [9] * 12], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    kw = dict(dtype='bfloat16', max_batch_size=4, max_num_batched_tokens=32, quant_group_size=32 if mode == 'w4a8' else None)
    twin = 'int8' if mode == 'w8a8' else 'int4'
    plain = build_engine(path, **kw, quantization=twin, quantize=quantize_model)
    quant = build_engine(path, **kw, quantization=mode, quantize=quantize_model)
    want, got = [o.token_ids for o in plain.generate(prompts, sp, use_tqdm=False)], [o.token_ids for o in quant.generate(prompts, sp, use_tqdm=False)]
    assert quant.model.quantization == mode and weight_bytes(quant.model) < weight_bytes(build_engine(path, dtype='bfloat16').model)
    assert got == want

@needs_vnni
@pytest.mark.parametrize('model_kind', ['llama_untied_mha', 'qwen3'])
@pytest.mark.parametrize('mode,kind', [('w8a8', 'w8'), ('w4a8', 'w4')])
def test_decode_call_gives_the_layers_tokens_and_logprobs(wide, mode, kind, model_kind):
    """The decode call takes the integer layers (their products through the integer kernel, the LM head through the bfloat16 one): greedy and
    seeded tokens and logprobs equal to the layers' own forward, step for step."""
    from nanoserve.fast import amx_kernel
    if amx_kernel() is None: pytest.skip("no bfloat16 dot products here: no bfloat16 decode call")
    path = wide(model_kind)
    kw = dict(dtype='bfloat16', quantization=mode, quantize=quantize_model, max_batch_size=4, max_model_len=256,
              quant_group_size=32 if mode == 'w4a8' else None)
    call, layers = build_engine(path, **kw), build_engine(path, **kw, decode_call=False)
    assert call.runner.decode_call is not None and call.runner.decode_call.quant == kind, call.runner.decode_call_off
    prompts = [[5, 6, 7], list(range(10, 60)), [9] * 12, [40, 41]]
    params = [SamplingParams(max_tokens=20, temperature=t, seed=i, logprobs=2, ignore_eos=True) for i, t in enumerate((0, 0.8, 0, 1.0))]
    got, want = call.generate(prompts, params, use_tqdm=False), layers.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.logprobs for o in got] == [o.logprobs for o in want]

@needs_vnni
@pytest.mark.parametrize('mode', MODES)
def test_recorded_decode_over_integer_layers(wide, mode):
    "The CPU capture records decodes over the integer layers and replays them: the eager engine's tokens."
    from nanoserve.batch import PersistentBatch
    path = wide('llama_tied_gqa', peaky=True)
    sp, prompts = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), [[5, 6, 7], [8, 9, 10, 11], [40, 41]]
    kw = dict(dtype='bfloat16', quantization=mode, quantize=quantize_model, max_batch_size=2, max_model_len=128)
    eager = build_engine(path, **kw)
    captured = build_engine(path, **kw, bucket_decode=True, persist_inputs=True, capture_decode=True, batch=PersistentBatch)
    assert [o.token_ids for o in captured.generate(prompts, sp, use_tqdm=False)] == [o.token_ids for o in eager.generate(prompts, sp, use_tqdm=False)]
    stats = captured.decode_path.stats
    assert stats.replays > 0 and stats.replays == stats.decode_steps and captured.boot.warm

@needs_vnni
def test_server_serves_and_reports_the_mode(wide):
    "A real server in w8a8 on 127.0.0.1, asked through the openai client: it answers, and /health names the mode and its smaller weights."
    path = wide('llama_tied_gqa')
    with spawn_server(path, '--dtype', 'bfloat16', '--served-model-name', 'tiny', '--quantization', 'w8a8') as (url, _):
        h = httpx.get(url + '/health').json()['weights']
        r = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0).completions.create(model='tiny', prompt='hello', max_tokens=8,
                                                                                                 temperature=0)
    assert h['quantization'] == 'w8a8' and h['bytes'] < weight_bytes(build_engine(path, dtype='bfloat16').model)
    assert r.choices[0].finish_reason in ('length', 'stop') and r.usage.completion_tokens >= 1

@needs_vnni
@pytest.mark.parametrize('mode', MODES)
def test_default_model_answers_paris(default_model, mode):
    "The README's question, greedy, in each integer mode (w4a8 loads the int4 pull's codes as they are)."
    r = subprocess.run([NANOSERVE, 'generate', '--chat', '--json', '--max-tokens', '24', '--quantization', mode,
                        'What is the capital of France? Answer in one sentence.'], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'Paris' in json.loads(r.stdout.splitlines()[-1])['text']

@needs_vnni
def test_refusals_leave_the_model_as_it_was(tiny, wide):
    "A layer width the products cannot take, a group that does not divide it: refused naming the flag, before any layer is swapped."
    narrow = tiny('llama_tied_gqa')                                   # its MLP is 160 wide: not a multiple of 64
    with pytest.raises(ConfigError, match='multiplies 64 inputs at a time.*160.*--quantization int8'):
        build_engine(narrow, dtype='bfloat16', quantization='w8a8', quantize=quantize_model)
    m = build_engine(wide('llama_tied_gqa'), dtype='bfloat16').model
    with pytest.raises(ConfigError, match='--quant-group-size'): quantize_model(m, 'w4a8', 128)   # 64 inputs in groups of 128
    assert getattr(m, 'quantization', 'none') == 'none' and not any(isinstance(x, (W8A8Linear, W4A8Linear)) for x in m.modules())
    with pytest.raises(ConfigError, match='input width that is a multiple of 64'):
        w4a8_pack(torch.zeros(8, 96, dtype=torch.uint8), torch.ones(8, 3), torch.ones(8, 3), 32)
    r = subprocess.run([NANOSERVE, 'generate', '--model', str(narrow), '--quantization', 'w8a8', 'hi'], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and '--quantization int8' in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]

def test_unknown_mode_and_stray_group_size_refused(default_model):
    "An unknown mode names the integer ones; a group size given to a mode without weight groups is refused, not ignored."
    r = subprocess.run([NANOSERVE, 'generate', '--quantization', 'w9a9', 'hi'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'w8a8 or w4a8' in r.stderr, r.stderr[-2000:]
    from nanoserve.engine import EngineConfig
    for mode in ('int8', 'w8a8'):
        with pytest.raises(ConfigError, match='--quant-group-size.*drop it, or use int4 or w4a8'): EngineConfig(quantization=mode, quant_group_size=32)

@pytest.mark.skipif(a8_isa() is not None, reason="this CPU has AVX512-VNNI: the integer modes run here")
def test_refused_without_vnni(default_model):
    "On a CPU without AVX512-VNNI, --quantization w8a8 is refused at start, naming the weight-only mode that runs the same weights."
    r = subprocess.run([NANOSERVE, 'generate', '--quantization', 'w8a8', 'hi'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'avx512_vnni' in r.stderr and '--quantization int8' in r.stderr, r.stderr[-2000:]
