"Tiny random checkpoints load in nanoserve and match transformers (logits within 1e-4, 32 greedy tokens)."
import pytest, torch, transformers
from conftest import TINY_KINDS
from nanoserve.model import load_model, DenseKV
from nanoserve.generate import generate_ids, SampleSpec

PROMPT_LENS = (1, 5, 17, 40)

def prompts(vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in PROMPT_LENS]

@pytest.mark.parametrize('kind', sorted(TINY_KINDS))
def test_logits_match_transformers(tiny, kind):
    path = tiny(kind)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = load_model(path, 'float32')
    ps = prompts(ours.config.vocab_size)
    kv = DenseKV(ours.config.num_hidden_layers, num_seqs=len(ps))
    with torch.inference_mode():
        got = ours.compute_logits(ours(torch.cat(ps), torch.cat([torch.arange(len(p)) for p in ps]), kv.step([len(p) for p in ps])))
        want = torch.cat([hf(p[None]).logits[0].float() for p in ps])
    assert got.shape == want.shape
    err = (got - want).abs().max().item()
    assert err < 1e-4, f"{kind}: max |logit difference| {err:.2e}"

@pytest.mark.parametrize('kind', sorted(TINY_KINDS))
def test_greedy_32_tokens_match_transformers(tiny, kind):
    path = tiny(kind)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = load_model(path, 'float32')
    for p in prompts(ours.config.vocab_size, seed=2)[1:]:
        out, reason = generate_ids(ours, p.tolist(), SampleSpec(max_tokens=32))
        want = hf.generate(p[None], attention_mask=torch.ones_like(p[None]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert (out, reason) == (want[0, len(p):].tolist(), 'length')

@pytest.mark.parametrize('kind', ['llama_tied_gqa', 'qwen3'])
def test_bfloat16_load_is_close(tiny, kind):
    "Not an acceptance bar, a sanity check: a bfloat16 load follows float32 closely."
    path = tiny(kind)
    f32, b16 = load_model(path, 'float32'), load_model(path, 'bfloat16')
    assert b16.dtype == torch.bfloat16 and b16.lm_head.weight is b16.model.embed_tokens.weight
    ids = prompts(f32.config.vocab_size)[2]
    with torch.inference_mode():
        a = f32.compute_logits(f32(ids, torch.arange(len(ids)), DenseKV(3).step([len(ids)])))
        b = b16.compute_logits(b16(ids, torch.arange(len(ids)), DenseKV(3).step([len(ids)])))
    assert (a.softmax(-1) - b.softmax(-1)).abs().max() < 0.02
