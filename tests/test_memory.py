"""The weights resident once: where the packed copies serve every product, an engine built from a checkpoint frees the
original weights (a tied LM head kept), and gives the very bits of an engine that kept them; /health reports the
process's peak resident memory."""
import asyncio
import httpx, pytest, torch
from nanoserve.engine import Engine
from nanoserve.fast import FastLinear
from nanoserve.launch import build_app, build_engine
from nanoserve.model import load_model
from nanoserve.sampling import SamplingParams
from nanoserve.tokenizer import Tokenizer
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
    tied = freed.model.lm_head.weight is freed.model.model.embed_tokens.weight
    if not all(m.is_packed and (m.invariant or m.amx is not None) for m in linears):
        pytest.skip(f"this CPU has no kernel of nanoserve's own for {name} products: their originals stay")
    assert [released(m) for m in linears] == [not (tied and m is freed.model.lm_head) for m in linears]
    assert not any(released(m) for m in kept.model.modules() if isinstance(m, FastLinear))
    assert [tuple(m.weight.shape) for m in linears] == [tuple(m.weight.shape) for m in kept.model.modules()
                                                        if isinstance(m, FastLinear)]
    assert outputs(freed) == outputs(kept)

def test_a_quantized_engine_reads_the_originals_first(tmp_path):
    path = make_tiny(tmp_path/'q', 'llama_untied_mha', dtype=torch.bfloat16)
    engine = build_engine(path, dtype='bfloat16', quantization='int8')
    assert not any(isinstance(m, FastLinear) and released(m) for m in engine.model.modules())
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
