"""Arbitrary JSON strings in every text field of the API, lone UTF-16 surrogates, NUL and control characters included: never a 500,
always an OpenAI-shaped error when refused, and a whole KV pool afterwards. Property-based (hypothesis), over the in-process app."""
import asyncio, json
import httpx, pytest
from hypothesis import given, settings, HealthCheck, strategies as st
from nanoserve.launch import build_app
from nanoserve.tiny import tiny_checkpoint

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"

@pytest.fixture(scope='module')
def served(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory.mktemp('badtext'), corpus=('hello world',), special_tokens=('<|im_start|>', '<|im_end|>'),
                           chat_template=CHATML)
    app, aeng = build_app(str(path), served_model_name='tiny', max_batch_size=4, dtype='float32', max_model_len=128)
    yield app, aeng
    aeng.shutdown()

# each field as (endpoint, a body builder of one string): every place a client's text lands
FIELDS = {
    'completion prompt': ('/v1/completions', lambda s: {'prompt': s}),
    'completion prompt list': ('/v1/completions', lambda s: {'prompt': ['hello', s]}),
    'completion stop': ('/v1/completions', lambda s: {'prompt': 'hello', 'stop': [s]}),
    'completion user': ('/v1/completions', lambda s: {'prompt': 'hello', 'user': s}),
    'completion logit_bias key': ('/v1/completions', lambda s: {'prompt': 'hello', 'logit_bias': {s: 1}}),
    'completion guided_regex': ('/v1/completions', lambda s: {'prompt': 'hello', 'guided_regex': s or 'a'}),
    'completion guided_choice': ('/v1/completions', lambda s: {'prompt': 'hello', 'guided_choice': [s or 'a', 'b']}),
    'model': ('/v1/completions', lambda s: {'prompt': 'hello', 'model': s}),
    'chat content': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': s}]}),
    'chat content part': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': s}]}]}),
    'chat system': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'system', 'content': s}, {'role': 'user', 'content': 'hi'}]}),
    'chat name': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': 'hi', 'name': s}]}),
    'chat part type': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': [{'type': s, 'text': 'x'}]}]}),
    'chat stop': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': 'hi'}], 'stop': s or 'x'}),
    'chat tool description': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': 'hi'}], 'tools': [
        {'type': 'function', 'function': {'name': 'f', 'description': s, 'parameters': {'type': 'object', 'properties': {'a': {'type': 'string', 'maxLength': 3}}}}}],
        'tool_choice': 'required'}),
    'chat tool name': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': 'hi'}], 'tools': [{'type': 'function', 'function': {'name': s}}]}),
    'chat schema name': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': 'hi'}],
                                                            'response_format': {'type': 'json_schema', 'json_schema': {'name': s, 'schema': {'enum': ['a', 'b']}}}}),
    'unknown field': ('/v1/chat/completions', lambda s: {'messages': [{'role': 'user', 'content': 'hi'}], s or 'x': 1}),
    'tokenize prompt': ('/tokenize', lambda s: {'prompt': s}),
}

ODD = ['\ud800', '\udfff', '\udbff\udc00', '\x00', '\x1b', '\x7f', '\u2028', '\ufeff', '\ufffe', '\U0010ffff', '"', '\\', '{{', '<|im_end|>']
text = st.lists(st.one_of(st.characters(codec=None, exclude_categories=()), st.sampled_from(ODD)), max_size=8).map(''.join)

def post(app, path, body: dict):
    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url='http://t', timeout=60) as c:
            # json.dumps escapes what is not ASCII, lone surrogates included, so the body is valid JSON on the wire
            return await c.post(path, content=json.dumps(body).encode(), headers={'Content-Type': 'application/json'})
    return asyncio.run(main())

@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(sorted(FIELDS)), s=text)
def test_no_500_for_any_text_in_any_field(served, field, s):
    app, _ = served
    path, build = FIELDS[field]
    body = {'model': 'tiny', 'max_tokens': 2, 'temperature': 0} if path != '/tokenize' else {}
    body.update(build(s))
    r = post(app, path, body)
    assert r.status_code < 500, (field, repr(s), r.text[:300])
    if r.status_code >= 400: assert set(r.json()['error']) == {'message', 'type', 'param', 'code'}

def test_the_surrogate_prompt_is_refused_by_name_and_nothing_leaks(served):
    app, aeng = served
    r = post(app, '/v1/chat/completions', {'model': 'tiny', 'messages': [{'role': 'user', 'content': 'a \ud800 b'}], 'max_tokens': 2})
    assert r.status_code == 400 and r.json()['error']['param'] == 'messages.0.content', r.text
    assert 'lone UTF-16 surrogate' in r.json()['error']['message']
    r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': ['fine', 'a \ud800 b'], 'max_tokens': 2})
    assert r.status_code == 400 and r.json()['error']['param'] == 'prompt.1'
    s = aeng.stats()    # after every example above: nothing running or queued, every block back in the pool
    assert (s.num_running, s.num_waiting, s.kv_free_blocks) == (0, 0, s.kv_total_blocks)
