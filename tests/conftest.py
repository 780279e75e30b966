"Fixtures: tiny random checkpoints written with transformers' save_pretrained, and the real default model."
import json, os, shutil
from pathlib import Path
import pytest, torch, transformers

transformers.logging.set_verbosity_error(); transformers.logging.disable_progress_bar()

TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3, max_position_embeddings=512,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)

# name -> (transformers config class, extra config fields)
TINY_KINDS = {
    'llama_tied_gqa': (transformers.LlamaConfig, dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)),
    'llama_untied_mha': (transformers.LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)),
    'llama_attention_bias': (transformers.LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True)),
    'qwen2_bias': (transformers.Qwen2Config, dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    'llama3_rope': (transformers.LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=1, rope_scaling={
        'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
        'original_max_position_embeddings': 64}, rope_theta=500000.0)),
    'llama_linear_rope': (transformers.LlamaConfig, dict(num_attention_heads=4, num_key_value_heads=2,
                                                         rope_scaling={'rope_type': 'linear', 'factor': 2.0})),
    'mistral': (transformers.MistralConfig, dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
}

def tiny_tokenizer():
    "A byte-level BPE with 320 tokens (3 special), trained on a few sentences: enough for any text, emoji included."
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["the capital of France is Paris", "hello world", "abc xyz"] * 10, trainers.BpeTrainer(
        vocab_size=TINY['vocab_size'], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=['<|endoftext|>', '<|im_start|>', '<|im_end|>']))
    return tok

def make_tiny(path: Path, kind: str, seed: int = 0, dtype=torch.float32) -> Path:
    "Write a tiny random transformers model of `kind` to `path` with save_pretrained; return path."
    cls, extra = TINY_KINDS[kind]
    torch.manual_seed(seed)
    cfg = cls(**{**TINY, **extra})
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():   # random init leaves norms at 1 and biases at 0: perturb them so they matter
        for n, p in model.named_parameters():
            if n.endswith('norm.weight') or n.endswith('.bias'): p.add_(torch.randn_like(p) * 0.1)
    model.to(dtype).save_pretrained(path)
    tiny_tokenizer().save(str(path/'tokenizer.json'))
    return path

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

def break_forward_after(engine, steps: int, message: str = 'injected fault in the forward', once_holding: int = 0):
    """Make the engine's forward raise after `steps` good steps (fault injection for the serving tests); with `once_holding`,
    only steps taken while at least that many requests are in the engine count, so none of them can arrive after the fault."""
    real, calls = engine.runner.execute, []
    def flaky(out):
        if len(engine.scheduler.running) + len(engine.scheduler.waiting) >= once_holding: calls.append(1)
        if len(calls) > steps: raise RuntimeError(message)
        return real(out)
    engine.runner.execute = flaky
