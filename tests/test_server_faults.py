"Server behaviour that needs the engine broken or full: the in-process app over httpx's ASGI transport (the real HTTP stack, no socket)."
import asyncio
import httpx, pytest
from nanoserve.launch import build_app
from conftest import break_forward_after

def client_for(app): return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url='http://test', timeout=30)

def test_engine_fault_gives_500_and_health_503(tiny):
    app, aeng = build_app(str(tiny('llama_tied_gqa')), served_model_name='tiny', max_batch_size=4)
    break_forward_after(aeng.engine, 2, once_holding=3)      # all three in the engine before it fails: each must get the 500
    async def main():
        async with client_for(app) as c:
            rs = await asyncio.wait_for(asyncio.gather(*(c.post('/v1/completions', json={'model': 'tiny', 'prompt': 'hello', 'max_tokens': 200, 'seed': i})
                                                         for i in range(3))), 30)
            return rs, await c.get('/health'), await c.post('/v1/completions', json={'model': 'tiny', 'prompt': 'hi'})
    try:
        rs, health, after = asyncio.run(main())
        assert all(r.status_code == 500 and 'injected fault in the forward' in r.json()['error']['message'] for r in rs)
        assert health.status_code == 503 and health.json()['status'] == 'dead'
        assert after.status_code == 503
    finally: aeng.shutdown()

@pytest.mark.parametrize('body,status,fragment', [
    ({'model': 'tiny', 'prompt': 5}, 400, 'prompt'),
    ({'model': 'tiny', 'prompt': 'x', 'max_tokens': 'many'}, 400, 'max_tokens'),
    ({'model': 'tiny', 'prompt': 'x', 'max_tokens': 10 ** 9}, 200, None),          # capped by the context: finishes 'length'
    ({'model': 'tiny', 'prompt': 'x', 'n': -1}, 400, 'n'),
    ({'model': 'tiny', 'prompt': 'x', 'colour': 'red'}, 400, "unknown field 'colour'"),
    ({'model': 'tiny', 'messages': []}, 400, 'messages'),
    ([1, 2, 3], 400, 'JSON object'),
])
def test_hand_written_bad_requests(tiny, body, status, fragment):
    app, aeng = build_app(str(tiny('llama_tied_gqa')), served_model_name='tiny', max_model_len=64)
    path = '/v1/chat/completions' if isinstance(body, dict) and 'messages' in body else '/v1/completions'
    async def main():
        async with client_for(app) as c: return await c.post(path, json=body)
    try:
        r = asyncio.run(main())
        assert r.status_code == status, r.text
        if fragment: assert fragment in r.json()['error']['message']
        else: assert r.json()['choices'][0]['finish_reason'] == 'length'
    finally: aeng.shutdown()

def test_full_queue_gives_503_with_retry_after(tiny):
    app, aeng = build_app(str(tiny('llama_tied_gqa')), served_model_name='tiny', max_batch_size=1, max_waiting=1)
    async def main():
        async with client_for(app) as c:
            first = [asyncio.create_task(c.post('/v1/completions', json={'model': 'tiny', 'prompt': 'hello', 'max_tokens': 200, 'seed': i})) for i in range(2)]
            async def both_in():                   # the engine's own counters say both are in; a deadline, never a hang
                while aeng.stats().num_running + aeng.stats().num_waiting < 2: await asyncio.sleep(0.01)
            await asyncio.wait_for(both_in(), 60)
            refused = await c.post('/v1/completions', json={'model': 'tiny', 'prompt': 'hello', 'max_tokens': 5})
            await asyncio.gather(*first)
            return refused
    try:
        r = asyncio.run(main())
        assert r.status_code == 503 and r.headers['retry-after'] == '1' and 'at capacity' in r.json()['error']['message']
    finally: aeng.shutdown()
