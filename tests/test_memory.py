"""The weights resident once: where the own kernels' copies serve every product, an engine built from a checkpoint frees
the original weights (a tied LM head's too, its copy then serving the embedding), and gives the very bits of an engine
that kept them; after a real load of the default model in every mode, the tensors the model holds add up to one copy
of its weights; /health reports the process's peak resident memory. Peak RSS itself is measured by bench/memory.py
(a benchmark, not a test)."""
import asyncio
import httpx, pytest, torch
from torch import nn
from nanoserve.engine import Engine
from nanoserve.fast import FastLinear, PackedEmbedding, amx_kernel
from nanoserve.launch import build_app, build_engine
from nanoserve.model import load_model
from nanoserve.sampling import SamplingParams
from nanoserve.tokenizer import Tokenizer
from nanoserve.weights import read_headers, checkpoint_files
from conftest import make_tiny

PROMPTS = ['the capital of France is', 'hello world', [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20] * 3]
PARAMS = [SamplingParams(max_tokens=12, temperature=0, logprobs=2),
          SamplingParams(max_tokens=12, temperature=0.8, seed=3),
          SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)]

def released(linear: FastLinear) -> bool:
    w = linear.weight
    return w.stride() == (0, 0) and w.untyped_storage().nbytes() == w.element_size()

def outputs(engine: Engine):
    return [(o.token_ids, o.logprobs) for o in engine.generate(PROMPTS, PARAMS, use_tqdm=False)]

@pytest.mark.parametrize('kind, dtype, flags', [
    ('llama_untied_mha', torch.float32, {}),
    ('llama_tied_gqa', torch.bfloat16, {}),
    ('llama_untied_mha', torch.bfloat16, {'batch_invariant': False}),
])
def test_an_engine_frees_the_originals_and_keeps_the_bits(tmp_path, kind, dtype, flags):
    path = make_tiny(tmp_path/kind, kind, dtype=dtype)
    name = str(dtype).removeprefix('torch.')
    kept = Engine.build(load_model(path, name), tokenizer=Tokenizer.from_dir(path), **flags)   # a loaded model: kept
    freed = Engine.build(path, dtype=name, **flags)
    linears = [m for m in freed.model.modules() if isinstance(m, FastLinear)]
    if not all(m.is_packed and (m.amx is not None or m.f32 is not None) for m in linears):
        pytest.skip(f"this CPU has no kernel of nanoserve's own for {name} products: their originals stay")
    assert all(released(m) for m in linears)
    # a tied LM head's copy serves the embedding, which stays tied to it
    emb = freed.model.model.embed_tokens
    if kind == 'llama_tied_gqa': assert type(emb) is PackedEmbedding and emb.weight is freed.model.lm_head.weight
    else: assert type(emb) is nn.Embedding
    assert not any(released(m) for m in kept.model.modules() if isinstance(m, FastLinear))
    assert [tuple(m.weight.shape) for m in linears] == [tuple(m.weight.shape) for m in kept.model.modules()
                                                        if isinstance(m, FastLinear)]
    assert outputs(freed) == outputs(kept)

def test_a_quantized_engine_quantizes_before_it_packs(tmp_path):
    "The quantizer reads the originals before anything is packed: the layers hold codes, the LM head alone is packed."
    path = make_tiny(tmp_path/'q', 'llama_untied_mha', dtype=torch.bfloat16)
    engine = build_engine(path, dtype='bfloat16', quantization='int8')
    assert [m for m in engine.model.modules() if isinstance(m, FastLinear)] == [engine.model.lm_head]
    assert released(engine.model.lm_head) == (engine.model.lm_head.amx is not None)
    assert len(engine.generate(['hello'], SamplingParams(max_tokens=4), use_tqdm=False)[0].token_ids) == 4

def test_health_reports_the_peak_resident_memory(tiny):
    app, aeng = build_app(str(tiny('llama_tied_gqa')), served_model_name='tiny', max_batch_size=2, dtype='float32')
    async def health():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url='http://t') as c:
            return (await c.get('/health')).json()
    try:
        peak = asyncio.run(health())['stats']['peak_rss_bytes']
        assert 100 << 20 < peak < 16 << 30          # torch alone holds over 100 MB; a tiny model far less than 16 GB
    finally: aeng.shutdown()

def held_bytes(model: nn.Module) -> int:
    """Bytes of every tensor the model's modules hold (parameters, buffers and plain tensor attributes such as the
    packed copies), each storage counted once: what the model keeps resident."""
    seen, total = set(), 0
    for m in model.modules():
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False),
                  *(v for v in vars(m).values() if isinstance(v, torch.Tensor))]:
            s = t.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
    return total


def checkpoint_bytes(path, element_size: int) -> int:
    "The checkpoint's tensors at `element_size` bytes a value (the LM head tied: counted once, as the file has it)."
    return sum(element_size * torch.Size(info.shape).numel() for info in read_headers(checkpoint_files(path)).values())


@pytest.mark.parametrize('mode', ['bfloat16', 'no-batch-invariant', 'int8', 'int4', 'float32'])
def test_weights_resident_once(default_model, mode):
    if amx_kernel() is None and mode != 'float32':
        pytest.skip("this CPU has no AMX or AVX512-BF16: bfloat16 products keep oneDNN's copy and the original")
    kw = {'bfloat16': {}, 'no-batch-invariant': {'batch_invariant': False}, 'int8': {'quantization': 'int8'},
          'int4': {'quantization': 'int4'}, 'float32': {'dtype': 'float32'}}[mode]
    engine = build_engine(default_model, **{'dtype': 'bfloat16', 'max_batch_size': 4, 'max_model_len': 512,
                                            'num_kv_blocks': 64, **kw})
    model = engine.model
    linears = [m for m in model.modules() if isinstance(m, FastLinear)]
    # every product kept only its packed copy (the original a one-element stub), and no oneDNN copy beside it
    assert linears and all(m.weight.untyped_storage().nbytes() == m.weight.element_size() for m in linears)
    assert all(m.packed is None for m in linears)
    # the default model's LM head is tied: the embedding reads the head's packed copy
    emb = model.model.embed_tokens
    assert type(emb) is PackedEmbedding and emb.weight is model.lm_head.weight
    # quantized: the decoder layers hold only their codes, no FastLinear left in them
    if mode in ('int8', 'int4'): assert linears == [model.lm_head]
    one_copy = checkpoint_bytes(default_model, 4 if mode == 'float32' else 2)
    held = held_bytes(model)
    if mode in ('int8', 'int4'): assert held < 0.75 * one_copy, (held, one_copy)
    else: assert one_copy <= held <= 1.02 * one_copy, (held, one_copy)     # blocks' padding and the rotary tables
    # and it still answers as it did: greedy tokens of a real prompt through the prefill and the decode call, the bits of
    # the same engine over a model that kept its original weights (handed in loaded: speed_up then releases nothing);
    # quantized, where that model would be quantized after its packing instead, the answer names Paris
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=1)
    out = engine.generate(['The capital of France is'], params, use_tqdm=False)[0]
    if mode in ('int8', 'int4'): assert 'Paris' in out.text and len(out.token_ids) == 8, out.text
    else:
        kept = Engine.build(load_model(default_model, engine.config.dtype if mode == 'float32' else 'bfloat16'),
                            engine.tokenizer, config=engine.config)
        assert all(m.weight.untyped_storage().nbytes() > m.weight.element_size()
                   for m in kept.model.modules() if isinstance(m, FastLinear))
        ref = kept.generate(['The capital of France is'], params, use_tqdm=False)[0]
        assert (out.token_ids, out.logprobs) == (ref.token_ids, ref.logprobs)
