"""`--runner pooling` and /v1/embeddings: a real `nanoserve serve` on 127.0.0.1, the real `openai` client, and sentence-transformers'
own `encode` of the same checkpoint as the reference (the tiny Qwen3 saved by sentence-transformers as Qwen3-Embedding is)."""
import base64, json
import httpx, numpy as np, pytest, torch
from openai import OpenAI, BadRequestError
from sentence_transformers import SentenceTransformer
from nanoserve.loadgen import spawn_server
from conftest import make_embedder, make_tiny

TEXTS = ['hello world', 'the capital of France is Paris', 'abc xyz abc xyz hello world the capital', 'Paris',
         'xyz abc', 'hello hello hello world world', 'France', 'the capital of xyz is abc and hello is world']

@pytest.fixture(scope='module')
def models_(tmp_path_factory):
    return {'last': make_embedder(tmp_path_factory.mktemp('emb_last')),
            'mean': make_embedder(tmp_path_factory.mktemp('emb_mean'), 'mean', matryoshka=False, seed=1)}

@pytest.fixture(scope='module')
def server(models_):
    # float32, and a step budget that cuts the longer inputs into chunks
    with spawn_server(models_['last'], '--runner', 'pooling', '--served-model-name', 'emb', '--dtype', 'float32',
                      '--max-num-batched-tokens', '16', '--max-model-len', '64') as (url, _):
        yield url

def client(url): return OpenAI(base_url=url + '/v1', api_key='none')

def reference(path, texts):
    return torch.tensor(SentenceTransformer(str(path), device='cpu').encode(texts, batch_size=3))

def test_equal_to_sentence_transformers(server, models_):
    got = client(server).embeddings.create(model='emb', input=TEXTS, encoding_format='float')
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    ours, want = torch.tensor([d.embedding for d in got.data]), reference(models_['last'], TEXTS)
    assert ours.shape == want.shape == (len(TEXTS), 64)
    assert torch.nn.functional.cosine_similarity(ours, want).min() >= 0.9999
    n = sum(len(httpx.post(server + '/tokenize', json={'prompt': t}).json()['tokens']) for t in TEXTS)
    assert got.usage.prompt_tokens == got.usage.total_tokens == n

def test_mean_pooling_equal_to_sentence_transformers(models_):
    with spawn_server(models_['mean'], '--runner', 'pooling', '--served-model-name', 'emb', '--dtype', 'float32',
                      '--max-num-batched-tokens', '8') as (url, _):
        got = client(url).embeddings.create(model='emb', input=TEXTS, encoding_format='float')
        health = httpx.get(url + '/health').json()
    assert health['runner'] == 'pooling' and health['pooler']['pooling'] == 'mean' and health['prefix_cache'] is False
    ours = torch.tensor([d.embedding for d in got.data])
    assert torch.nn.functional.cosine_similarity(ours, reference(models_['mean'], TEXTS)).min() >= 0.9999

def test_base64_is_the_float32_bytes(server):
    "The SDK's default (base64, decoded with NumPy) and floats are the same vector; the raw base64 is little-endian float32."
    c = client(server)
    floats = [d.embedding for d in c.embeddings.create(model='emb', input=TEXTS[:3], encoding_format='float').data]
    decoded = [d.embedding for d in c.embeddings.create(model='emb', input=TEXTS[:3]).data]
    assert np.array_equal(np.array(floats, dtype=np.float32), np.array(decoded, dtype=np.float32))
    raw = httpx.post(server + '/v1/embeddings', json={'model': 'emb', 'input': TEXTS[0], 'encoding_format': 'base64'}).json()
    assert np.array_equal(np.frombuffer(base64.b64decode(raw['data'][0]['embedding']), '<f4'), np.array(floats[0], dtype=np.float32))

def test_token_ids_in(server):
    c = client(server)
    ids = [httpx.post(server + '/tokenize', json={'prompt': t}).json()['tokens'] for t in TEXTS[:2]]
    by_text = c.embeddings.create(model='emb', input=TEXTS[:2], encoding_format='float').data
    assert c.embeddings.create(model='emb', input=ids[0], encoding_format='float').data[0].embedding == by_text[0].embedding
    assert [d.embedding for d in c.embeddings.create(model='emb', input=ids, encoding_format='float').data] == [d.embedding for d in by_text]

def test_batch_invariant_bit_for_bit(server):
    "Each input's vector alone equals its vector among all the others, chunked differently beside them."
    c = client(server)
    together = [d.embedding for d in c.embeddings.create(model='emb', input=TEXTS, encoding_format='float').data]
    alone = [c.embeddings.create(model='emb', input=t, encoding_format='float').data[0].embedding for t in TEXTS]
    assert together == alone

def test_batch_invariant_in_bfloat16(models_):
    "The same in the CPU's bfloat16 (--dtype auto), whose products and attention run in one order at every batch."
    with spawn_server(models_['last'], '--runner', 'pooling', '--served-model-name', 'emb', '--max-num-batched-tokens', '16') as (url, _):
        health = httpx.get(url + '/health').json()
        c = client(url)
        together = [d.embedding for d in c.embeddings.create(model='emb', input=TEXTS, encoding_format='float').data]
        alone = [c.embeddings.create(model='emb', input=t, encoding_format='float').data[0].embedding for t in TEXTS]
    if not health['batch_invariant']['enabled']: pytest.skip(f"batch-invariant mode off here: {health['batch_invariant']['why_not']}")
    assert health['dtype'] == 'bfloat16' and together == alone

def test_dimensions(server):
    "Matryoshka truncation where the model says it was trained for it: the prefix, normalized again; past the width refused."
    c = client(server)
    full = torch.tensor(c.embeddings.create(model='emb', input=TEXTS[1], encoding_format='float').data[0].embedding)
    cut = torch.tensor(c.embeddings.create(model='emb', input=TEXTS[1], encoding_format='float', dimensions=16).data[0].embedding)
    assert cut.shape == (16,) and abs(float(cut.norm()) - 1) < 1e-5
    assert torch.allclose(cut, torch.nn.functional.normalize(full[:16], dim=0), atol=1e-6)
    with pytest.raises(BadRequestError, match='cut to 1 to 64'): c.embeddings.create(model='emb', input='x', dimensions=65)

def test_dimensions_refused_without_matryoshka(models_):
    with spawn_server(models_['mean'], '--runner', 'pooling', '--served-model-name', 'emb', '--dtype', 'float32') as (url, _):
        with pytest.raises(BadRequestError, match='not trained for shorter embeddings'):
            client(url).embeddings.create(model='emb', input='hello', dimensions=16)

def test_bad_inputs_refused_and_nothing_held(server):
    c = client(server)
    for body, says in [({'input': ['hello', '']}, 'input.1 is empty'), ({'input': []}, 'empty list'),
                       ({'input': ['hello', 'abc ' * 80]}, 'input.1: the input has'), ({'input': [[1, 2], [99999]]}, 'input.1: prompt token ids'),
                       ({'input': 'x', 'encoding_format': 'int8'}, 'encoding_format'), ({'input': 'x', 'dimensions': 0}, 'dimensions')]:
        r = httpx.post(server + '/v1/embeddings', json={'model': 'emb', **body})
        assert r.status_code == 400 and says in r.json()['error']['message'], (body, r.text)
    ids = httpx.post(server + '/tokenize', json={'prompt': 'abc ' * 80}).json()['tokens'][:64]
    assert len(c.embeddings.create(model='emb', input=ids).data[0].embedding) == 64     # exactly max_model_len: embeds
    s = httpx.get(server + '/health').json()['stats']
    assert (s['num_running'], s['num_waiting'], s['kv_free_blocks']) == (0, 0, s['kv_total_blocks'])

def test_wrong_runner_is_a_clear_400(server, tmp_path):
    r = httpx.post(server + '/v1/chat/completions', json={'model': 'emb', 'messages': [{'role': 'user', 'content': 'hi'}]})
    assert r.status_code == 400 and 'pooling runner' in r.json()['error']['message'] and '/v1/embeddings' in r.json()['error']['message']
    with spawn_server(make_tiny(tmp_path, 'llama_tied_gqa'), '--served-model-name', 'tiny', '--max-model-len', '64') as (url, _):
        with pytest.raises(BadRequestError, match='--runner pooling'):
            client(url).embeddings.create(model='tiny', input='hello')

def test_bare_decoder_and_causal_lm_both_load(models_, tmp_path):
    "The checkpoint may name the bare decoder (Qwen3Model) or the causal LM: the same weights give the same vectors."
    from nanoserve.pooling import build_pooling_engine, embed
    bare = json.loads((models_['last']/'config.json').read_text())['architectures']
    lm = make_tiny(tmp_path, 'qwen3')
    a = embed(build_pooling_engine(models_['last'].parent/'lm', dtype='float32'), TEXTS[:3])
    b = embed(build_pooling_engine(models_['last'], dtype='float32'), TEXTS[:3])
    assert bare == ['Qwen3Model'] and json.loads((lm/'config.json').read_text())['architectures'] == ['Qwen3ForCausalLM']
    assert torch.equal(a, b)
