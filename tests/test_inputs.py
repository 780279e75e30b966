"""The one request type: the input processor builds an `EngineRequest` per choice from a chat body, a completion body
and a token-id prompt, and every field is what the body asked for; the server's routes run exactly those requests."""
import asyncio, json
from dataclasses import replace
import httpx, pytest
from nanoserve.async_engine import AsyncEngine, EngineRequest
from nanoserve.core import RequestError
from nanoserve.engine import Engine
from nanoserve.grammar import Structured
from nanoserve.launch import build_app
from nanoserve.protocol import ChatRequest, CompletionRequest, InputProcessor, TokenizeRequest
from nanoserve.sampling import SamplingParams

CHATML = ("{% if tools %}<|im_start|>system\nTOOLS {% for t in tools %}{{ t.function.name }} {% endfor %}"
          "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}<|im_start|>assistant\n")

@pytest.fixture(scope='module')
def chat_tiny(tiny, tmp_path_factory):
    "The tiny checkpoint with a ChatML template that reads `tools` (as Llama 3.1's and Qwen 2.5's do)."
    import shutil
    path = tmp_path_factory.mktemp('inputs')/'tiny'
    shutil.copytree(tiny('llama_tied_gqa'), path)
    (path/'tokenizer_config.json').write_text(json.dumps({'chat_template': CHATML, 'eos_token': '<|im_end|>'}))
    return path

@pytest.fixture(scope='module')
def aeng(chat_tiny):
    a = AsyncEngine(Engine.build(chat_tiny, max_batch_size=4, dtype='float32'))
    yield a
    a.shutdown()

def params(**kw) -> SamplingParams:
    "The params a body's fields should become (the API's defaults for the rest)."
    return SamplingParams(**kw)

def test_a_chat_body_becomes_one_request_per_choice(aeng):
    inputs = InputProcessor(aeng, defaults={'top_p': 0.9, 'temperature': 0.3}, default_max_tokens=None)
    schema_q = {'type': 'object', 'properties': {'q': {'type': 'string'}}}
    fn = {'type': 'function', 'function': {'name': 'lookup', 'parameters': schema_q}}
    msgs = [{'role': 'developer', 'content': 'Be brief.'},
            {'role': 'user', 'content': [{'type': 'text', 'text': 'hello'}]}]
    body = ChatRequest(model='tiny', messages=msgs, tools=[fn], tool_choice='required', n=2, seed=7, temperature=0.8,
                       max_completion_tokens=9, top_k=5, min_p=0.05, presence_penalty=0.5, frequency_penalty=-0.5,
                       repetition_penalty=1.1, stop=['\n\n'], stop_token_ids=[3], logit_bias={'4': -2}, logprobs=True,
                       top_logprobs=3, skip_special_tokens=False, include_stop_str_in_output=True, ignore_eos=True)
    reqs = inputs.chat(body)
    assert len(reqs) == 2 and all(isinstance(r, EngineRequest) for r in reqs)
    # the template reads tools: they are passed to it, and the text tokenized by the one route
    assert aeng.chat_knows_tools
    rendered = [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hello'}]
    want_ids = tuple(aeng.engine.tokenizer.encode_chat(rendered, tools=[fn]))
    schema = {'type': 'array', 'minItems': 1, 'items': {'type': 'object', 'required': ['name', 'arguments'],
              'additionalProperties': False, 'properties': {'name': {'const': 'lookup'},
                                                            'arguments': fn['function']['parameters']}}}
    for j, r in enumerate(reqs):
        assert r.prompt_ids == want_ids
        assert (r.params.structured.kind, json.loads(r.params.structured.spec)) == ('json', schema)
        assert replace(r.params, structured=None) == params(
            max_tokens=9, temperature=0.8, top_p=0.9, top_k=5, min_p=0.05, presence_penalty=0.5, frequency_penalty=-0.5,
            repetition_penalty=1.1, seed=7 + j, stop=('\n\n',), stop_token_ids=(3,), logit_bias={4: -2.0}, logprobs=3,
            skip_special_tokens=False, include_stop_str_in_output=True, ignore_eos=True)
        assert (r.tool_mode, dict(r.tools), r.echo) == ('required', {'lookup': fn['function']['parameters']}, '')
    # no max_tokens: the rest of the context; no tools: no tool mode
    [plain] = inputs.chat(ChatRequest(model='tiny', messages=[{'role': 'user', 'content': 'hi'}]))
    assert plain.params.max_tokens == aeng.max_model_len - len(plain.prompt_ids)
    assert (plain.params.temperature, plain.params.top_p, plain.tool_mode, plain.tools) == (0.3, 0.9, None, None)
    assert list(plain.prompt_ids) == inputs.tokenize(TokenizeRequest(messages=[{'role': 'user', 'content': 'hi'}]))

def test_a_completion_body_and_token_id_prompts(aeng):
    inputs = InputProcessor(aeng, default_max_tokens=5)
    body = CompletionRequest(model='tiny', prompt=['hello', 'the capital of'], n=2, seed=1, echo=True, top_p=0.5,
                             response_format={'type': 'json_object'})
    reqs = inputs.completion(body)
    tok = aeng.engine.tokenizer
    assert [r.prompt_ids for r in reqs] == [tuple(tok.encode('hello'))] * 2 + [tuple(tok.encode('the capital of'))] * 2
    assert [r.echo for r in reqs] == ['hello', 'hello', 'the capital of', 'the capital of']
    assert [r.params for r in reqs] == [params(max_tokens=5, seed=s, top_p=0.5, structured=Structured.json_schema(None))
                                        for s in (1, 2, 1, 2)]
    assert {(r.tool_mode, r.tools) for r in reqs} == {(None, None)}
    ids = CompletionRequest(model='tiny', prompt=[[5, 6, 7], [8]], max_tokens=3, echo=True)
    reqs = inputs.completion(ids)
    want = [((5, 6, 7), aeng.decode([5, 6, 7]), params(max_tokens=3)), ((8,), aeng.decode([8]), params(max_tokens=3))]
    assert [(r.prompt_ids, r.echo, r.params) for r in reqs] == want

@pytest.mark.parametrize('body, message', [
    (CompletionRequest(model='tiny', prompt=[[5, 10**6]]), 'prompt token ids [1000000] are outside the vocabulary'),
    (CompletionRequest(model='tiny', prompt=[5] * 600), 'the prompt has 600 tokens but max_model_len is'),
    (CompletionRequest(model='tiny', prompt='a', stop_token_ids=[10**6]),
     'stop_token_ids [1000000] are not in the vocabulary'),
    (CompletionRequest(model='tiny', prompt='a', guided_regex='('), 'cannot be used for structured output'),
    (CompletionRequest(model='tiny', prompt='a', suffix='x'), "'suffix' is part of the OpenAI API"),
    (ChatRequest(model='tiny', messages=[{'role': 'user', 'content': [{'type': 'image_url'}]}]),
     "a 'image_url' part cannot"),
])
def test_each_refusal_comes_from_the_processor_before_the_engine(aeng, body, message):
    inputs = InputProcessor(aeng)
    before = aeng.stats().num_requests
    with pytest.raises(RequestError, match=None) as e:
        inputs.completion(body) if isinstance(body, CompletionRequest) else inputs.chat(body)
    assert message in str(e.value)
    assert aeng.stats().num_requests == before                      # nothing reached the engine

def test_the_routes_run_the_processors_requests(chat_tiny):
    """Over HTTP, a completion's choices are what the engine gives the processor's requests, and /tokenize counts a
    chat's prompt."""
    app, aeng = build_app(str(chat_tiny), served_model_name='tiny', max_batch_size=4, dtype='float32')
    async def run(path, body):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url='http://t', timeout=30) as c:
            return (await c.post(path, json=body)).json()
    try:
        body = {'model': 'tiny', 'prompt': [[5, 6, 7], [8, 9]], 'n': 2, 'seed': 3, 'max_tokens': 4, 'temperature': 0.9}
        r = asyncio.run(run('/v1/completions', body))
        reqs = app.state.served.inputs.completion(CompletionRequest(**body))
        async def direct():
            outs = []
            for req in reqs:
                async for o in aeng.generate(req): last = o
                outs.append(last)
            return outs
        assert [c['text'] for c in r['choices']] == [o.text for o in asyncio.run(direct())]
        chat = {'model': 'tiny', 'messages': [{'role': 'user', 'content': 'hello'}], 'max_tokens': 1}
        counted = asyncio.run(run('/tokenize', {'messages': chat['messages']}))['count']
        assert asyncio.run(run('/v1/chat/completions', chat))['usage']['prompt_tokens'] == counted
        empty = asyncio.run(run('/tokenize', {'messages': []}))              # was a 500 before the processor
        assert empty['error']['message'] == 'messages: give at least one message'
    finally: aeng.shutdown()
