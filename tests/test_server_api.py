"API details over the in-process app (httpx ASGI transport): n > 1, logprobs, stop strings, chat streaming shape."
import asyncio, json
import httpx, pytest
from nanoserve.launch import build_app
from nanoserve.engine import Engine
from nanoserve.sampling import SamplingParams

@pytest.fixture(scope='module')
def app(tiny):
    app, aeng = build_app(str(tiny('llama_tied_gqa')), served_model_name='tiny', max_batch_size=8, dtype='float32')
    yield app
    aeng.shutdown()

def post(app, path, body):
    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url='http://t', timeout=30) as c:
            return await c.post(path, json=body)
    return asyncio.run(main())

def test_n_choices_use_seed_plus_index(app, tiny):
    r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 6, 'n': 3, 'seed': 10, 'temperature': 0.9}).json()
    want = Engine.build(tiny('llama_tied_gqa'), dtype='float32').generate(['hello'] * 3, [SamplingParams(max_tokens=6, seed=10 + i, temperature=0.9) for i in range(3)], use_tqdm=False)
    assert [c['index'] for c in r['choices']] == [0, 1, 2]
    assert [c['text'] for c in r['choices']] == [w.text for w in want]
    assert r['usage']['completion_tokens'] == sum(len(w.token_ids) for w in want)

def test_logprobs_are_returned(app):
    r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 4, 'logprobs': 3, 'temperature': 0}).json()
    lp = r['choices'][0]['logprobs']
    assert len(lp['token_logprobs']) == 4 and all(x <= 0 for x in lp['token_logprobs'])
    assert all(len(t) >= 3 for t in lp['top_logprobs'])

def test_stop_string_over_http(app, tiny):
    full = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'abc', 'max_tokens': 12, 'temperature': 0}).json()['choices'][0]['text']
    stop = full[3:5]
    r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'abc', 'max_tokens': 12, 'temperature': 0, 'stop': stop}).json()['choices'][0]
    assert (r['text'], r['finish_reason']) == (full[:full.find(stop)], 'stop')
