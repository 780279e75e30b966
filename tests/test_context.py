"""Day 64, the model's own context: served by default (the default model takes 8192 tokens, and a 7,000-token prompt is
answered with default flags); /health says what set max_model_len; a prompt too long for it is refused
with a message naming the bound and the flag that would raise it. And a long prompt's last positions against
transformers, in float32 (the parity tests stop near 80 positions)."""
from pathlib import Path
import httpx, openai, pytest, torch, transformers
from nanoserve.engine import Engine
from nanoserve.loadgen import spawn_server
from forcing import forced_logprobs

PARAGRAPH = ("The river rose in the spring, as it did every year, and the people of the valley moved their boats and "
             "their sheep to the higher fields until the water went down again. ")

def test_a_7000_token_prompt_to_the_default_model_with_default_flags(default_model):
    with spawn_server(default_model) as (url, _):
        health = httpx.get(url + '/health').json()
        assert (health['max_model_len'], health['max_model_len_bound_by'], health['model_context']) == (8192, 'model',
                                                                                                        8192)
        text = PARAGRAPH * 200
        n = httpx.post(url + '/tokenize', json={'prompt': text}).json()['count']
        text = text[:len(text) * 7000 // n]                       # about 7,000 tokens of it
        n = httpx.post(url + '/tokenize', json={'prompt': text}).json()['count']
        assert 6900 <= n < 8192
        client = openai.OpenAI(base_url=url + '/v1', api_key='none', timeout=600)
        r = client.completions.create(model=health['model'], prompt=text, max_tokens=4, temperature=0)
        assert r.usage.prompt_tokens == n and r.usage.completion_tokens == 4
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=health['model'], prompt=[5] * 8192, max_tokens=4)
        assert "the prompt has 8192 tokens but max_model_len is 8192 (the model's own context)" in str(e.value)
        assert httpx.get(url + '/health').json()['kv_pool']['num_blocks'] > 0

@pytest.mark.parametrize('flags, bound, says', [
    (('--max-model-len', '128'), 'max_model_len',
     'max_model_len is 128 (--max-model-len; the model takes 512): shorten the prompt (it must leave room for at least '
     'one generated token), or serve with a larger --max-model-len'),
    (('--num-kv-blocks', '10'), 'kv_pool',
     'max_model_len is 160 (all the KV pool holds for one request; the model takes 512): shorten the prompt (it must '
     'leave room for at least one generated token), or serve with a larger KV pool (--kv-cache-gb or --num-kv-blocks)'),
])
def test_what_bounds_the_context_is_said(tiny, flags, bound, says):
    with spawn_server(tiny('llama_tied_gqa'), '--dtype', 'float32', '--served-model-name', 'tiny', *flags) as (url, _):
        health = httpx.get(url + '/health').json()
        assert (health['max_model_len_bound_by'], health['model_context']) == (bound, 512)
        r = httpx.post(url + '/v1/completions', json={'model': 'tiny', 'prompt': [5] * 200, 'max_tokens': 2})
        assert r.status_code == 400 and says in r.json()['error']['message']
        r = httpx.post(url + '/v1/completions', json={'model': 'tiny', 'prompt': [5] * 20, 'max_tokens': 2})
        assert r.status_code == 200

LONG_TEXT = Path(__file__).resolve().parents[1]/'bench'/'data'/'buildlog_prose.txt'
LAST = 16      # positions compared at the end of the long prompt

def long_prompt(tokenizer, n: int = 2100) -> list[int]:
    "The first `n` tokens of a few thousand tokens of English prose that ships with the repository."
    ids = tokenizer.encode(LONG_TEXT.read_text())
    assert len(ids) > n
    return ids[:n]

def test_a_2000_token_prompt_matches_transformers_at_its_last_positions(default_model):
    """Float32, the default model through the engine with its default flags (the prompt prefilled in chunks of the
    step's budget, then the decode path): with the text's last 16 tokens forced, each position's top-5 logprobs equal
    transformers' on the same 2,100 tokens to float32's rounding, and its best token is transformers' wherever that one
    is not a near-tie."""
    engine = Engine.build(default_model, dtype='float32')
    ids = long_prompt(engine.tokenizer)
    got = forced_logprobs(engine, [ids[:-LAST]], [ids[-LAST:]])[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model, dtype=torch.float32).eval()
    with torch.inference_mode(): logits = hf(torch.tensor([ids])).logits[0, -LAST - 1:-1].float()
    want = torch.log_softmax(logits, -1)
    assert len(got) == LAST
    for i, lp in enumerate(got):
        assert max(abs(v - want[i, t].item()) for t, v in lp.items()) < 5e-4, (i, lp)
        top2 = want[i].topk(2)
        if top2.values[0] - top2.values[1] > 0.01: assert max(lp, key=lp.get) == top2.indices[0].item(), i
