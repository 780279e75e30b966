"""The OpenAI request surface real clients send, against a real `nanoserve serve` of the default model on 127.0.0.1: the official
openai client for the forms it produces (content parts, prompt lists, token ids, n over a prompt list, streaming with usage,
structured output, tool calls), raw httpx for the rest; /metrics' vLLM names; fields the server does not implement."""
import asyncio, json
import httpx, jsonschema, openai, pytest
from nanoserve.loadgen import spawn_server
from nanoserve.engine import Engine
from nanoserve.sampling import SamplingParams
from schemas import SCHEMAS, PROMPTS

NAME = 'smol'

@pytest.fixture(scope='module')
def server(default_model):
    # float32: the tests compare tokens between batches of different shapes (see Day 12 on what bfloat16 does to that);
    # --generation-config none: they compare with the engine's SamplingParams, whose defaults are the API's, not the model card's top_p 0.9
    with spawn_server(default_model, '--dtype', 'float32', '--max-batch-size', '32', '--served-model-name', NAME, '--generation-config', 'none') as (url, _):
        yield default_model, url

@pytest.fixture(scope='module')
def client(server): return openai.OpenAI(base_url=server[1] + '/v1', api_key='none', max_retries=0)


def test_chat_content_parts_are_the_joined_text(client):
    parts = [{'type': 'text', 'text': 'What is the capital'}, {'type': 'text', 'text': 'of France?'}]
    a = client.chat.completions.create(model=NAME, messages=[{'role': 'user', 'content': parts}], max_tokens=12, temperature=0)
    b = client.chat.completions.create(model=NAME, messages=[{'role': 'user', 'content': 'What is the capital\nof France?'}], max_tokens=12, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content and a.usage.prompt_tokens == b.usage.prompt_tokens
    dev = client.chat.completions.create(model=NAME, messages=[{'role': 'developer', 'content': 'Answer in one word.'},
                                                               {'role': 'user', 'content': 'Capital of France?', 'name': 'ann'}], max_tokens=8, temperature=0)
    sys_ = client.chat.completions.create(model=NAME, messages=[{'role': 'system', 'content': 'Answer in one word.'},
                                                                {'role': 'user', 'content': 'Capital of France?'}], max_tokens=8, temperature=0)
    assert dev.choices[0].message.content == sys_.choices[0].message.content          # developer is rendered as system
    with pytest.raises(openai.BadRequestError, match="a 'image_url' part cannot be used: this model takes text only"):
        client.chat.completions.create(model=NAME, max_tokens=4, messages=[{'role': 'user', 'content': [
            {'type': 'text', 'text': 'what is in this picture?'}, {'type': 'image_url', 'image_url': {'url': 'https://example.com/a.png'}}]}])

def test_completions_prompt_list_token_ids_and_n(client, server):
    path, url = server
    prompts = ['The capital of France is', 'One, two, three,']
    r = client.completions.create(model=NAME, prompt=prompts, n=2, max_tokens=6, temperature=0.8, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    offline = Engine.build(path, dtype='float32').generate([p for p in prompts for _ in range(2)],
                                                           [SamplingParams(max_tokens=6, temperature=0.8, seed=11 + j) for _ in prompts for j in range(2)], use_tqdm=False)
    assert [c.text for c in r.choices] == [o.text for o in offline]                    # prompt i's choice j is choice i*n+j, seed + j
    assert r.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in offline[::2])   # each prompt counted once
    ids = httpx.post(url + '/tokenize', json={'model': NAME, 'prompt': prompts[0]}).json()['tokens']
    t = client.completions.create(model=NAME, prompt=[ids, ids], max_tokens=6, temperature=0.8, seed=11)
    assert [c.text for c in t.choices] == [offline[0].text, offline[0].text]         # a list of lists of token ids
    one = client.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0.8, seed=11)
    assert one.choices[0].text == offline[0].text                                       # a list of token ids is one prompt
    e = client.completions.create(model=NAME, prompt=prompts[0], max_tokens=6, temperature=0.8, seed=11, echo=True)
    assert e.choices[0].text == prompts[0] + offline[0].text

def test_streaming_with_usage_over_a_prompt_list(client):
    prompts = ['The capital of France is', 'One, two, three,']
    want = client.completions.create(model=NAME, prompt=prompts, n=2, max_tokens=6, temperature=0.8, seed=3)
    chunks = list(client.completions.create(model=NAME, prompt=prompts, n=2, max_tokens=6, temperature=0.8, seed=3, stream=True,
                                            stream_options={'include_usage': True}))
    texts = {}
    for c in chunks:
        for ch in c.choices: texts[ch.index] = texts.get(ch.index, '') + ch.text
    assert [texts[i] for i in range(4)] == [c.text for c in want.choices]
    assert chunks[-1].usage.model_dump() == want.usage.model_dump()
    chat = list(client.chat.completions.create(model=NAME, messages=[{'role': 'user', 'content': [{'type': 'text', 'text': 'Hi!'}]}], max_tokens=5,
                                               temperature=0, stream=True, stream_options={'include_usage': True}))
    assert chat[-1].usage.completion_tokens == 5 and chat[0].choices[0].delta.role == 'assistant'
    whole_chat = client.chat.completions.create(model=NAME, messages=[{'role': 'user', 'content': [{'type': 'text', 'text': 'Hi!'}]}], max_tokens=5, temperature=0)
    assert ''.join(c.choices[0].delta.content or '' for c in chat if c.choices) == whole_chat.choices[0].message.content   # streamed = not streamed
    # logprobs stream too, each token's with the chunk that carries its text
    kw = dict(model=NAME, messages=[{'role': 'user', 'content': 'Hi!'}], max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = [t for c in client.chat.completions.create(**kw, stream=True) if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in whole] and len(whole) == 6
    cw = client.completions.create(model=NAME, prompt='One, two,', max_tokens=5, temperature=0, logprobs=1).choices[0].logprobs
    cs = [t for c in client.completions.create(model=NAME, prompt='One, two,', max_tokens=5, temperature=0, logprobs=1, stream=True)
          if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert cs == cw.tokens and len(cs) == 5

def test_routine_parameters_are_honoured(client, server):
    path, url = server
    base = dict(model=NAME, messages=[{'role': 'user', 'content': 'Count from one to ten.'}], temperature=0)
    r = client.chat.completions.create(**base, max_completion_tokens=7, user='someone')
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == 'length'
    ban = client.chat.completions.create(**base, max_completion_tokens=7)
    first = httpx.post(url + '/tokenize', json={'prompt': ban.choices[0].message.content, 'add_special_tokens': False}).json()['tokens'][0]
    biased = client.chat.completions.create(**base, max_completion_tokens=7, logit_bias={str(first): -100})
    assert biased.choices[0].message.content != ban.choices[0].message.content        # the token the model wanted first is banned
    lp = client.chat.completions.create(**base, max_completion_tokens=3, logprobs=True, top_logprobs=2)
    assert len(lp.choices[0].logprobs.content) == 3 and all(len(t.top_logprobs) == 2 for t in lp.choices[0].logprobs.content)
    full = client.chat.completions.create(**base, max_completion_tokens=30).choices[0].message.content
    word = full.split()[3]
    s = client.chat.completions.create(**base, max_completion_tokens=30, stop=[word, 'never seen'])
    assert s.choices[0].finish_reason == 'stop' and s.choices[0].message.content == full[:full.index(word)]
    v = client.chat.completions.create(**base, max_completion_tokens=5, extra_body={'top_k': 1, 'min_p': 0.1, 'repetition_penalty': 1.1,
                                                                                   'ignore_eos': True, 'min_tokens': 5, 'skip_special_tokens': True})
    assert v.usage.completion_tokens == 5
    p = client.chat.completions.create(**base, max_completion_tokens=5, presence_penalty=1.5, frequency_penalty=1.0, seed=4, n=2,
                                       parallel_tool_calls=False, store=False)
    assert len(p.choices) == 2

def test_unimplemented_fields_are_refused_by_name(server):
    url = server[1]
    chat = {'model': NAME, 'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 2}
    for field, value in [('audio', {'voice': 'alloy', 'format': 'wav'}), ('modalities', ['text', 'audio']), ('prediction', {'type': 'content', 'content': 'x'}),
                         ('reasoning_effort', 'high'), ('functions', [{'name': 'f'}]), ('store', True), ('service_tier', 'flex'),
                         ('web_search_options', {}), ('verbosity', 'low')]:
        r = httpx.post(url + '/v1/chat/completions', json={**chat, field: value})
        assert r.status_code == 400 and f"'{field}' is part of the OpenAI API, but nanoserve does not support it" in r.json()['error']['message'], (field, r.text)
        assert r.json()['error']['param'] == field
    for field, value in [('suffix', 'the end'), ('best_of', 3)]:
        r = httpx.post(url + '/v1/completions', json={'model': NAME, 'prompt': 'a', 'max_tokens': 2, field: value})
        assert r.status_code == 400 and f"'{field}' is part of the OpenAI API" in r.json()['error']['message']
    assert httpx.post(url + '/v1/completions', json={'model': NAME, 'prompt': 'a', 'max_tokens': 2, 'best_of': 2, 'n': 2}).status_code == 200
    assert httpx.post(url + '/v1/chat/completions', json={**chat, 'modalities': ['text'], 'store': False, 'metadata': {}}).status_code == 200

def valid(text: str, schema: dict) -> bool:
    try: jsonschema.validate(json.loads(text), schema); return True
    except (json.JSONDecodeError, jsonschema.ValidationError): return False

async def _structured(url, stream: bool):
    aclient = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none', max_retries=0)    # one per event loop
    async def one(prompt, schema, i):
        kw = dict(model=NAME, messages=[{'role': 'user', 'content': prompt}], max_tokens=256, temperature=0.7, seed=i,
                  response_format={'type': 'json_schema', 'json_schema': {'name': f's{i}', 'schema': schema}})
        if not stream: return (await aclient.chat.completions.create(**kw)).choices[0].message.content
        text = ''
        async for c in await aclient.chat.completions.create(**kw, stream=True):
            if c.choices and c.choices[0].delta.content: text += c.choices[0].delta.content
        return text
    return await asyncio.gather(*(one(p, s, i) for i, (p, s) in enumerate(zip(PROMPTS, SCHEMAS))))

@pytest.mark.parametrize('stream', [False, True])
def test_twenty_json_schemas_parse_and_validate(server, stream):
    texts = asyncio.run(_structured(server[1], stream))
    bad = [(i, t) for i, (t, s) in enumerate(zip(texts, SCHEMAS)) if not valid(t, s)]
    assert bad == [], bad

def test_json_object_guided_forms_and_unconstrained_neighbours(client, server):
    path, url = server
    r = client.chat.completions.create(model=NAME, messages=[{'role': 'user', 'content': 'Give me a JSON object with two keys: name and color.'}], max_tokens=200,
                                       temperature=0, response_format={'type': 'json_object'})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    c = client.completions.create(model=NAME, prompt='Is the sky blue? Answer:', max_tokens=5, extra_body={'guided_choice': ['yes', 'no']})
    assert c.choices[0].text in ('yes', 'no') and c.choices[0].finish_reason == 'stop'
    g = client.completions.create(model=NAME, prompt='A phone number:', max_tokens=20, extra_body={'guided_regex': r'\d{3}-\d{4}'})
    assert len(g.choices[0].text) == 8 and g.choices[0].text[3] == '-'
    # greedy output without a grammar is the same with or without constrained requests in its batch
    plain = dict(model=NAME, messages=[{'role': 'user', 'content': 'Tell me about Paris.'}], max_tokens=24, temperature=0)
    alone = client.chat.completions.create(**plain).choices[0].message.content
    async def together():
        a = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
        jobs = [a.chat.completions.create(**plain)] + [a.chat.completions.create(model=NAME, max_tokens=64, temperature=0.5, seed=i,
                    messages=[{'role': 'user', 'content': p}], response_format={'type': 'json_schema', 'json_schema': {'name': 'x', 'schema': s}})
                    for i, (p, s) in enumerate(zip(PROMPTS[:6], SCHEMAS[:6]))]
        return [r.choices[0].message.content for r in await asyncio.gather(*jobs)]
    outs = asyncio.run(together())
    assert outs[0] == alone
    assert alone == Engine.build(path, dtype='float32').generate([[{'role': 'user', 'content': 'Tell me about Paris.'}]],
                                                                 SamplingParams(max_tokens=24, temperature=0), use_tqdm=False)[0].text
    bad = httpx.post(url + '/v1/chat/completions', json={**plain, 'response_format': {'type': 'json_schema', 'json_schema': {'name': 'x', 'schema': {'type': 'frob'}}}})
    assert bad.status_code == 400 and 'JSON schema cannot be used' in bad.json()['error']['message']

WEATHER = {'type': 'function', 'function': {'name': 'get_weather', 'description': 'Current weather in a city',
           'parameters': {'type': 'object', 'properties': {'city': {'type': 'string', 'maxLength': 30}, 'unit': {'enum': ['celsius', 'fahrenheit']}},
                          'required': ['city', 'unit']}}}
TIME = {'type': 'function', 'function': {'name': 'get_time', 'description': 'Current time in a timezone',
        'parameters': {'type': 'object', 'properties': {'timezone': {'type': 'string', 'maxLength': 30}}, 'required': ['timezone']}}}
ASK = [{'role': 'user', 'content': 'What is the weather like in Paris today?'}]

def check_call(call, tools=(WEATHER, TIME)):
    spec = {t['function']['name']: t['function']['parameters'] for t in tools}
    assert call.type == 'function' and call.id.startswith('call_') and call.function.name in spec
    jsonschema.validate(json.loads(call.function.arguments), spec[call.function.name])

def test_named_and_required_tool_calls(client):
    named = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER, TIME], max_tokens=64, temperature=0,
                                           tool_choice={'type': 'function', 'function': {'name': 'get_weather'}})
    m = named.choices[0].message
    assert named.choices[0].finish_reason == 'stop' and m.content is None and [c.function.name for c in m.tool_calls] == ['get_weather']   # OpenAI's: a named call ends with 'stop'
    check_call(m.tool_calls[0])
    req = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER, TIME], max_tokens=96, temperature=0, tool_choice='required',
                                         parallel_tool_calls=False)
    assert req.choices[0].finish_reason == 'tool_calls' and len(req.choices[0].message.tool_calls) == 1
    check_call(req.choices[0].message.tool_calls[0])
    # the conversation goes on: the call and its result sent back are accepted and rendered
    follow = client.chat.completions.create(model=NAME, max_tokens=16, temperature=0, tools=[WEATHER, TIME], messages=ASK + [
        {'role': 'assistant', 'content': None, 'tool_calls': [c.model_dump() for c in m.tool_calls]},
        {'role': 'tool', 'tool_call_id': m.tool_calls[0].id, 'content': '{"temp": 21}'}])
    assert follow.choices[0].message.content or follow.choices[0].message.tool_calls
    none = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER], tool_choice='none', max_tokens=8, temperature=0)
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content

def test_tool_calls_stream_as_deltas(client):
    def run(**kw):
        calls, finish = {}, None
        for c in client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER, TIME], max_tokens=96, temperature=0, stream=True, **kw):
            if not c.choices: continue
            for d in c.choices[0].delta.tool_calls or []:
                acc = calls.setdefault(d.index, {'id': None, 'name': None, 'arguments': ''})
                acc['id'] = d.id or acc['id']; acc['name'] = (d.function.name if d.function else None) or acc['name']
                acc['arguments'] += (d.function.arguments or '') if d.function else ''
            finish = c.choices[0].finish_reason or finish
        return calls, finish
    named, finish = run(tool_choice={'type': 'function', 'function': {'name': 'get_weather'}})
    assert finish == 'stop' and named[0]['name'] == 'get_weather' and named[0]['id'].startswith('call_')
    jsonschema.validate(json.loads(named[0]['arguments']), WEATHER['function']['parameters'])
    whole = client.chat.completions.create(model=NAME, messages=ASK, tools=[WEATHER, TIME], max_tokens=96, temperature=0,
                                           tool_choice={'type': 'function', 'function': {'name': 'get_weather'}})
    assert named[0]['arguments'] == whole.choices[0].message.tool_calls[0].function.arguments   # the deltas add up to the whole
    required, finish = run(tool_choice='required', parallel_tool_calls=False)
    assert finish == 'tool_calls' and required and all(v['name'] in ('get_weather', 'get_time') for v in required.values())
    for v in required.values():
        jsonschema.validate(json.loads(v['arguments']), {'get_weather': WEATHER, 'get_time': TIME}[v['name']]['function']['parameters'])

def test_small_routes(server):
    url = server[1]
    m = httpx.get(url + '/v1/models').json()['data'][0]
    assert (m['id'], m['max_model_len']) == (NAME, httpx.get(url + '/health').json()['max_model_len'])
    assert httpx.get(url + '/version').json()['version']
    t = httpx.post(url + '/tokenize', json={'model': NAME, 'messages': [{'role': 'user', 'content': 'hi'}]}).json()
    assert t['count'] == len(t['tokens']) > 2
    assert 'hi' in httpx.post(url + '/detokenize', json={'model': NAME, 'tokens': t['tokens']}).json()['prompt']
    bad = httpx.post(url + '/detokenize', json={'tokens': [10 ** 9]})
    assert bad.status_code == 400 and 'outside the vocabulary' in bad.json()['error']['message']

VLLM_NAMES = ('vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc', 'vllm:prompt_tokens_total',
              'vllm:generation_tokens_total', 'vllm:time_to_first_token_seconds', 'vllm:inter_token_latency_seconds',
              'vllm:e2e_request_latency_seconds', 'vllm:request_success_total')

def scrape(url) -> dict[str, float]:
    "Sample name with labels -> value, and each metric's declared type under '# TYPE name'."
    out = {}
    for line in httpx.get(url + '/metrics').text.splitlines():
        if line.startswith('# TYPE'): _, _, name, kind = line.split(); out[f'# TYPE {name}'] = kind
        elif line and not line.startswith('#'): k, v = line.rsplit(' ', 1); out[k] = float(v)
    return out

def test_vllm_metric_names_move_with_traffic(client, server):
    url = server[1]
    before = scrape(url)
    r = client.completions.create(model=NAME, prompt='Hello there', max_tokens=5, temperature=0)
    after = scrape(url)
    lab = f'{{model_name="{NAME}"}}'
    for name, kind in [('vllm:num_requests_running', 'gauge'), ('vllm:num_requests_waiting', 'gauge'), ('vllm:kv_cache_usage_perc', 'gauge'),
                       ('vllm:prompt_tokens', 'counter'), ('vllm:generation_tokens', 'counter'), ('vllm:request_success', 'counter'),
                       ('vllm:time_to_first_token_seconds', 'histogram'), ('vllm:inter_token_latency_seconds', 'histogram'),
                       ('vllm:e2e_request_latency_seconds', 'histogram')]:
        assert after[f"# TYPE {name}{'_total' if kind == 'counter' else ''}"] == kind, name     # the text format names a counter by its sample
    assert after[f'vllm:prompt_tokens_total{lab}'] - before.get(f'vllm:prompt_tokens_total{lab}', 0) == r.usage.prompt_tokens
    assert after[f'vllm:generation_tokens_total{lab}'] - before.get(f'vllm:generation_tokens_total{lab}', 0) == 5
    ok = f'vllm:request_success_total{{finished_reason="length",model_name="{NAME}"}}'
    assert after[ok] - before.get(ok, 0) == 1
    assert after[f'vllm:time_to_first_token_seconds_count{lab}'] - before.get(f'vllm:time_to_first_token_seconds_count{lab}', 0) == 1
    assert after[f'vllm:inter_token_latency_seconds_count{lab}'] - before.get(f'vllm:inter_token_latency_seconds_count{lab}', 0) == 4
    assert after[f'vllm:e2e_request_latency_seconds_count{lab}'] - before.get(f'vllm:e2e_request_latency_seconds_count{lab}', 0) == 1
    assert after[f'vllm:num_requests_running{lab}'] == 0 and after[f'vllm:kv_cache_usage_perc{lab}'] == 0
    assert after['nanoserve_generation_tokens_total'] - before['nanoserve_generation_tokens_total'] == 5   # nanoserve's names stay
