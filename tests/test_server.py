"The server end to end: a real `nanoserve serve` process on 127.0.0.1 and the official openai client."
import asyncio, json, sys, time
from pathlib import Path
import httpx, openai, pytest
from conftest import make_tiny, TINY
from nanoserve.engine import Engine
from nanoserve.loadgen import spawn_server
from nanoserve.sampling import SamplingParams


@pytest.fixture(scope='module')
def server(tiny):
    path = tiny('llama_tied_gqa')
    with spawn_server(path, '--dtype', 'float32', '--max-batch-size', '8', '--served-model-name', 'tiny') as (url, _): yield path, url

def stats(url): return httpx.get(url + '/health').json()['stats']

def test_openai_client_matches_offline_engine(server):
    path, url = server
    client = openai.OpenAI(base_url=url + '/v1', api_key='none')
    offline = Engine.build(path, dtype='float32')
    want = offline.generate(['the capital of'], SamplingParams(max_tokens=12, temperature=0.8, seed=7), use_tqdm=False)[0]
    r = client.completions.create(model='tiny', prompt='the capital of', max_tokens=12, temperature=0.8, seed=7)
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == want.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want.prompt_token_ids), len(want.token_ids))
    chunks = list(client.completions.create(model='tiny', prompt='the capital of', max_tokens=12, temperature=0.8, seed=7,
                                            stream=True, stream_options={'include_usage': True}))
    assert ''.join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)

def test_chat_without_a_chat_template_is_a_400(server):
    "The tiny tokenizer has no chat template: the server says so (chat streamed against non-streamed is compared in test_openai_surface)."
    path, url = server
    client = openai.OpenAI(base_url=url + '/v1', api_key='none')
    with pytest.raises(openai.BadRequestError, match='no chat template'):
        client.chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': 'hello world'}], max_tokens=5)

def test_models_and_errors(server):
    path, url = server
    client = openai.OpenAI(base_url=url + '/v1', api_key='none')
    assert [m.id for m in client.models.list()] == ['tiny']
    with pytest.raises(openai.NotFoundError, match="model 'gpt-9' is not served here"): client.completions.create(model='gpt-9', prompt='x')
    with pytest.raises(openai.BadRequestError, match='top_p'): client.completions.create(model='tiny', prompt='x', top_p=3)
    r = httpx.post(url + '/v1/completions', content=b'{not json', headers={'Content-Type': 'application/json'})
    assert r.status_code == 400 and set(r.json()['error']) == {'message', 'type', 'param', 'code'}
    r = httpx.post(url + '/v1/completions', content=b'x' * (10 << 20), headers={'Content-Type': 'application/json'})
    assert r.status_code == 413

def test_32_concurrent_streams_then_pool_is_full(server):
    path, url = server
    client = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none')
    prompts = [f"hello world {'abc ' * (i % 9)}" for i in range(32)]
    async def one(i):
        text = ''
        async for c in await client.completions.create(model='tiny', prompt=prompts[i], max_tokens=4 + i % 13, seed=i, temperature=0.7, stream=True):
            text += c.choices[0].text if c.choices else ''
        return text
    async def main(): return await asyncio.gather(*(one(i) for i in range(32)))
    got = asyncio.run(main())
    want = Engine.build(path, dtype='float32').generate(prompts, [SamplingParams(max_tokens=4 + i % 13, seed=i, temperature=0.7) for i in range(32)], use_tqdm=False)
    assert got == [w.text for w in want]
    s = stats(url)
    assert (s['num_running'], s['kv_free_blocks']) == (0, s['kv_total_blocks'])

def test_dropped_clients_leave_nothing_held(server):
    path, url = server
    async def drop(i):
        async with httpx.AsyncClient(timeout=30) as c:
            async with c.stream('POST', url + '/v1/completions', json={'model': 'tiny', 'prompt': 'hello', 'max_tokens': 400, 'seed': i, 'stream': True}) as r:
                n = 0
                async for line in r.aiter_lines():
                    if line.startswith('data: '): n += 1
                    if n >= 3: break
    async def main(): await asyncio.gather(*(drop(i) for i in range(20)))
    asyncio.run(main())
    t0 = time.monotonic()
    while (s := stats(url))['num_running'] or s['num_waiting'] or s['kv_free_blocks'] != s['kv_total_blocks']:
        assert time.monotonic() - t0 < 30, s
        time.sleep(0.1)
    assert s['num_aborted'] >= 20
    m = httpx.get(url + '/metrics').text
    assert 'nanoserve_requests_running 0.0' in m and 'nanoserve_generation_tokens_total' in m

def test_api_key(tiny):
    with spawn_server(tiny('llama_tied_gqa'), '--dtype', 'float32', '--api-key', 'sekret', '--served-model-name', 'tiny') as (url, _):
        assert httpx.get(url + '/health').status_code == 200
        with pytest.raises(openai.AuthenticationError): openai.OpenAI(base_url=url + '/v1', api_key='wrong').models.list()
        assert [m.id for m in openai.OpenAI(base_url=url + '/v1', api_key='sekret').models.list()] == ['tiny']

def test_default_model_chat_streaming_and_not(default_model):
    # --generation-config none: the sampled answer is compared with the engine's SamplingParams, whose top_p is the API's 1.0
    with spawn_server(default_model, '--dtype', 'float32', '--max-batch-size', '4', '--generation-config', 'none') as (url, boot):
        client = openai.OpenAI(base_url=url + '/v1', api_key='none')
        name = client.models.list().data[0].id
        msgs = [{'role': 'user', 'content': 'What is the capital of France?'}]
        r = client.chat.completions.create(model=name, messages=msgs, max_tokens=48, temperature=0)
        assert 'Paris' in r.choices[0].message.content and r.choices[0].finish_reason == 'stop'
        offline = Engine.build(default_model, dtype='float32').generate([msgs], SamplingParams(max_tokens=48, temperature=0.7, seed=3), use_tqdm=False)[0]
        r = client.chat.completions.create(model=name, messages=msgs, max_tokens=48, temperature=0.7, seed=3)
        assert r.choices[0].message.content == offline.text
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(offline.prompt_token_ids), len(offline.token_ids))
        t1, first, pieces = time.monotonic(), None, []
        for c in client.chat.completions.create(model=name, messages=msgs, max_tokens=48, temperature=0.7, seed=3, stream=True):
            if c.choices and c.choices[0].delta.content:
                first = first or time.monotonic(); pieces.append(c.choices[0].delta.content)
        total = time.monotonic() - t1
        assert ''.join(pieces) == offline.text
        print(f"\nboot to first /health 200: {boot:.1f} s; streamed chat: TTFT {first - t1:.3f} s, "
              f"{len(offline.token_ids) / (total - (first - t1)):.1f} tok/s after the first token")

def test_make_serve_brings_up_a_server(tiny):
    "`make serve` on a tiny model: the README's main command answers /health (PORT=0: the server binds a port and says which)."
    root = Path(__file__).resolve().parents[1]
    cmd = ['make', '-s', 'serve', f'MODEL={tiny("llama_tied_gqa")}', 'PORT=0', f'BIN={Path(sys.executable).parent}']
    with spawn_server(command=cmd, port=0, cwd=str(root), timeout=120) as (url, _):
        r = httpx.get(url + '/health')
        assert r.json()['status'] == 'ok' and r.json()['kv_pool']['num_blocks'] > 0

@pytest.fixture(scope='module')
def long_context(tmp_path_factory):
    """A tiny model with a 16,384-token context: a request with no end of sequence runs for thousands of steps, so it is still
    decoding whatever the machine's speed when the test's other requests have come and gone."""
    path = make_tiny(tmp_path_factory.mktemp('long_context'), 'llama_tied_gqa')
    cfg = json.loads((path/'config.json').read_text())
    (path/'config.json').write_text(json.dumps({**cfg, 'max_position_embeddings': 16384}))
    assert TINY['eos_token_id'] is None
    return path

@pytest.mark.parametrize('ratio', ['1', 'inf'])
def test_waiting_served_ratio_prefills_a_crowd_in_one_step(long_context, ratio):
    """Day 16's --waiting-served-ratio through a real server: a crowd that arrives while one request decodes gets the whole token budget
    (the server counts such steps on /metrics) with a ratio of 1, and never with inf; the crowd's texts are the offline engine's either
    way, and the pool is whole afterwards. The decoding request cannot end first: it asks for the rest of a 16,384-token context, and
    is aborted once the crowd has its answers (its stream has not finished: the server's count of aborts says so)."""
    path = long_context
    flags = ('--dtype', 'float32', '--max-batch-size', '8', '--served-model-name', 'tiny', '--max-num-batched-tokens', '256',
             '--max-mixed-batched-tokens', '8', '--waiting-served-ratio', ratio, '--max-model-len', '16384')
    prompts = [f"hello world {'abc ' * (3 + i)}" for i in range(6)]
    params = [dict(max_tokens=6 + i, seed=i, temperature=0.7) for i in range(6)]
    with spawn_server(path, *flags) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none')
        async def one(i):
            r = await client.completions.create(model='tiny', prompt=prompts[i], **params[i])
            return r.choices[0].text
        async def main():
            long = await client.completions.create(model='tiny', prompt='the capital of', max_tokens=16000, temperature=0,
                                                   stream=True, extra_body={'ignore_eos': True})
            it = long.__aiter__(); await it.__anext__()            # its first token is out: it decodes while the crowd arrives
            got = await asyncio.gather(*(one(i) for i in range(6)))
            await long.close()                                     # the long one is aborted, not waited for
            return got
        got = asyncio.run(main())
        t0 = time.monotonic()
        while (s := stats(url))['num_running'] or s['num_waiting'] or s['kv_free_blocks'] != s['kv_total_blocks']:
            assert time.monotonic() - t0 < 30, s
            time.sleep(0.1)
        m = httpx.get(url + '/metrics').text
        paused = float(next(l.split()[1] for l in m.splitlines() if l.startswith('nanoserve_paused_steps_total ')))
        assert s['num_paused_steps'] == paused and 'nanoserve_preemptions_total' in m, (paused, s)
        assert s['num_aborted'] == 1, s                    # the long request was still decoding: the crowd arrived beside it
        assert paused >= 1 if ratio == '1' else paused == 0, (ratio, paused)
    want = Engine.build(path, dtype='float32').generate(prompts, [SamplingParams(**p) for p in params], use_tqdm=False)
    assert got == [w.text for w in want]
