"Fixtures: tiny random checkpoints (nanoserve.tiny, written with transformers' save_pretrained), and the real default model."
import json, os, shutil
from pathlib import Path
import pytest, torch, transformers
# the card's Triton kernels run in Triton's interpreter where there is no card (read when triton is first imported)
if not torch.cuda.is_available(): os.environ.setdefault('TRITON_INTERPRET', '1')
from nanoserve.tiny import tiny_checkpoint, CHAT_SPECIALS

transformers.logging.set_verbosity_error(); transformers.logging.disable_progress_bar()

TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3, max_position_embeddings=512,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
CORPUS = ("the capital of France is Paris", "hello world", "abc xyz")

# name -> (architecture, extra config fields): each one a case the loader must get right
TINY_KINDS = {
    'llama_tied_gqa': ('llama', dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)),
    'llama_untied_mha': ('llama', dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)),
    'llama_attention_bias': ('llama', dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True)),
    'qwen2_bias': ('qwen2', dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    'llama3_rope': ('llama', dict(num_attention_heads=4, num_key_value_heads=1, rope_scaling={
        'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
        'original_max_position_embeddings': 64}, rope_theta=500000.0)),
    'llama_linear_rope': ('llama', dict(num_attention_heads=4, num_key_value_heads=2, rope_scaling={'rope_type': 'linear', 'factor': 2.0})),
    'mistral': ('mistral', dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    # q/k norms per head; 4 heads of 32: a query width (128) twice the hidden width
    'qwen3': ('qwen3', dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                            rope_theta=1e6)),
    # mixtures of experts: Qwen3-MoE with a dense layer (mlp_only_layers) and its top k scaled to one; Mixtral's
    # w1/w2/w3 names and 2 of 4 experts; OLMoE's q and k norms over all heads, its top k unscaled
    'qwen3_moe': ('qwen3_moe', dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                                    num_experts_per_tok=3, moe_intermediate_size=96, norm_topk_prob=True,
                                    mlp_only_layers=[1], decoder_sparse_step=1)),
    'mixtral': ('mixtral', dict(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                num_experts_per_tok=2, intermediate_size=96)),
    'olmoe': ('olmoe', dict(num_attention_heads=4, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
                            intermediate_size=64, norm_topk_prob=False)),
}

def make_tiny(path: Path, kind: str, seed: int = 0, dtype=torch.float32) -> Path:
    "Write the tiny random checkpoint `kind` to `path` with nanoserve.tiny (norms and biases perturbed, so they matter); return path."
    arch, extra = TINY_KINDS[kind]
    return tiny_checkpoint(path, seed, corpus=CORPUS, special_tokens=CHAT_SPECIALS, arch=arch, perturb=True, dtype=dtype, **(TINY | extra))

@pytest.fixture(scope='session')
def tiny(tmp_path_factory):
    "A factory: tiny(kind) -> directory of a saved tiny random checkpoint (cached per session)."
    made = {}
    def get(kind: str) -> Path:
        if kind not in made: made[kind] = make_tiny(tmp_path_factory.mktemp(kind), kind)
        return made[kind]
    return get

@pytest.fixture(scope='session')
def peaky(tmp_path_factory):
    """A tiny checkpoint whose logits are far apart (its final norm scaled up), so that last-bit differences (a compiled step, a batch of
    another size) cannot flip a token: for tests that compare tokens across arithmetic that is equal only to rounding."""
    path = make_tiny(tmp_path_factory.mktemp('peaky'), 'llama_tied_gqa', seed=3)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad(): model.model.norm.weight.mul_(12)
    model.save_pretrained(path)
    return path

@pytest.fixture(scope='session')
def default_model() -> Path:
    "The real SmolLM2-135M-Instruct directory, pulled into the cache if needed."
    from nanoserve.pull import pull
    return pull()

def make_embedder(path: Path, pooling: str = 'lasttoken', matryoshka: bool = True, seed: int = 0) -> Path:
    """The tiny Qwen3 as an embedding model, saved by sentence-transformers itself as Qwen3-Embedding is published: the bare
    Qwen3Model, modules.json, a Pooling module (`pooling`) and a Normalize module; `matryoshka`: config.json says so (vLLM's key)."""
    from sentence_transformers import SentenceTransformer
    try: from sentence_transformers.sentence_transformer import modules as models      # its 6.x home
    except ImportError: from sentence_transformers import models
    src = make_tiny(path/'lm', 'qwen3', seed=seed)
    (src/'tokenizer_config.json').write_text(json.dumps({'pad_token': '<|endoftext|>', 'padding_side': 'left'}))
    transformers.AutoModel.from_pretrained(src).save_pretrained(path/'bare')
    transformers.AutoTokenizer.from_pretrained(src).save_pretrained(path/'bare')
    t = models.Transformer(str(path/'bare'))
    width = getattr(t, 'get_embedding_dimension', None) or t.get_word_embedding_dimension
    st = SentenceTransformer(modules=[t, models.Pooling(width(), pooling_mode=pooling), models.Normalize()])
    st.save(str(path/'st'))
    if matryoshka:
        cfg = json.loads((path/'st'/'config.json').read_text())
        (path/'st'/'config.json').write_text(json.dumps({**cfg, 'is_matryoshka': True}))
    return path/'st'

def break_forward_after(engine, steps: int, message: str = 'injected fault in the forward', once_holding: int = 0):
    """Make the engine's forward raise after `steps` good steps (fault injection for the serving tests); with `once_holding`,
    only steps taken while at least that many requests are in the engine count, so none of them can arrive after the fault."""
    real, calls = engine.runner.execute, []
    def flaky(out):
        if len(engine.scheduler.running) + len(engine.scheduler.waiting) >= once_holding: calls.append(1)
        if len(calls) > steps: raise RuntimeError(message)
        return real(out)
    engine.runner.execute = flaky

def pytest_terminal_summary(terminalreporter):
    "The kernel paths this CPU takes: a run's output (-q too) says which its batch-invariance tests covered."
    from nanoserve.fast import bf16_isa
    from nanoserve.f32_linear import f32_isa
    from nanoserve.integer import a8_isa
    from nanoserve.offline_bench import cpu_model
    bf = {'amx': "AMX's tiles at every row count",
          'avx512_bf16': "AVX512-BF16's dot products (no AMX here: its tile path is not run)",
          None: "no kernel of nanoserve's own (neither AMX nor AVX512-BF16 here: no bfloat16 path is run)"}[bf16_isa()]
    f32 = f"the {f32_isa()} kernel" if f32_isa() else "no kernel of nanoserve's own (no AVX2 here)"
    q8 = ("int8 and int4 products widened onto the same dot products" if bf16_isa()
          else "int8 and int4 products on PyTorch's ops (no bfloat16 kernel here)")
    att = {'amx': "bfloat16 attention in the shared order on AMX's tiles (the dot products' build only by the "
                  "prefill kernel notebook's checks)",
           'avx512_bf16': "bfloat16 attention in the shared order on AVX512-BF16's dot products (no AMX here: its "
                          "tile build is not run)",
           None: "bfloat16 attention in the decode kernel's float32 order (no AVX512-BF16 here)"}[bf16_isa()]
    a8 = {'amx': "w8a8 and w4a8 products on AMX-INT8's tiles past 4 rows and VNNI's dot products up to them (both "
                 "builds checked bit for bit)",
          'avx512_vnni': "w8a8 and w4a8 products on VNNI's dot products (no AMX here: the tile path is not run)",
          None: "no w8a8 or w4a8 products (no AVX512-VNNI here: the integer modes are refused)"}[a8_isa()]
    terminalreporter.write_line(f"cpu: {cpu_model()}; batch-invariant paths covered here: bfloat16 products on {bf}; "
                                f"float32 products on {f32}; {q8}; {a8}; {att}")

def pytest_configure(config):
    config.addinivalue_line('markers', "stress: depends on the order or timing of arrivals at a server, which no counter "
                                       "can pin down; run by `make stress`, left out of `make test`")
    config.addinivalue_line('markers', "hosts: builds network namespaces as test hosts (root, iproute2; skipped, "
                                       "saying so, without them); in `make test`, and alone in `make hosts`")
    config.addinivalue_line('markers', "cuda: needs a CUDA device; skipped elsewhere, run on the lent GPU machine "
                                       "by bench/gpu/run.sh (pytest -m cuda)")
