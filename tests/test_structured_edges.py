"""Structured output and tool calls at their edges, over the in-process app on a tiny model with a chat template: logprobs under a
grammar, inputs that overflow every allowed logit, seeds and temperatures at the limits, malformed tool-call history, schemas whose
objects are assembled with allOf, and an EOS the grammar ends on."""
import asyncio, json
import httpx, pytest
from nanoserve.launch import build_app
from nanoserve.tiny import tiny_checkpoint

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"

@pytest.fixture(scope='module')
def served(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory.mktemp('edges'), corpus=('hello world yes no', '{"a": 1, "b": [2, 3]}'),
                           special_tokens=('<|endoftext|>', '<|im_start|>', '<|im_end|>'), chat_template=CHATML, eos_token_id=2)
    app, aeng = build_app(str(path), served_model_name='tiny', max_batch_size=4, dtype='float32', max_model_len=256)
    yield app, aeng
    aeng.shutdown()

def no_inf(s): raise ValueError(f"{s} is not JSON")

def post(app, path, body, stream=False):
    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url='http://t', timeout=60) as c:
            r = await c.post(path, json=body)
            if not stream or r.status_code != 200: return r.status_code, r.json(parse_constant=no_inf)
            return r.status_code, [json.loads(l[6:], parse_constant=no_inf) for l in r.text.splitlines() if l.startswith('data: ') and l != 'data: [DONE]']
    return asyncio.run(main())

def healthy(aeng):
    s = aeng.stats()
    return aeng.running and (s.num_running, s.num_waiting, s.kv_free_blocks) == (0, 0, s.kv_total_blocks)

def test_logprobs_under_a_grammar_are_finite_and_the_models_own(served):
    app, aeng = served
    body = {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 4, 'logprobs': 5, 'guided_choice': ['yes', 'no']}
    code, r = post(app, '/v1/completions', body)      # parse_constant refuses -Infinity and NaN
    assert code == 200 and r['choices'][0]['text'] in ('yes', 'no'), r
    chat = {'model': 'tiny', 'messages': [{'role': 'user', 'content': 'hello'}], 'max_tokens': 4, 'logprobs': True, 'top_logprobs': 5,
            'guided_choice': ['yes', 'no']}
    code, c = post(app, '/v1/chat/completions', chat)
    assert code == 200 and all(len(t['top_logprobs']) >= 5 for t in c['choices'][0]['logprobs']['content'])   # more than the grammar allows
    code, chunks = post(app, '/v1/completions', {**body, 'stream': True}, stream=True)
    assert code == 200 and ''.join(c['choices'][0]['text'] for c in chunks if c['choices']) in ('yes', 'no')
    assert healthy(aeng)

def test_every_allowed_logit_overflowing_is_not_fatal(served):
    app, aeng = served
    code, r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'x x x', 'max_tokens': 3, 'temperature': 1, 'guided_regex': 'x+',
                                             'logit_bias': {'104': -100}, 'repetition_penalty': 1e39})
    assert code == 200 and set(r['choices'][0]['text']) <= {'x'}, r
    code, r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 3, 'temperature': 1e-40})
    assert code == 200
    code, r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 3, 'seed': 2 ** 70})
    assert code == 400 and 'seed must be an integer in' in r['error']['message']
    assert healthy(aeng)

def test_malformed_tool_call_history_is_a_400(served):
    app, aeng = served
    ask = {'role': 'user', 'content': 'hi'}
    for call in ({'id': 'c'}, {'id': 'c', 'function': 'f'}, {'id': 'c', 'function': {'name': 'f', 'arguments': {'a': 1}}}, 'not a call'):
        code, r = post(app, '/v1/chat/completions', {'model': 'tiny', 'max_tokens': 2, 'messages': [ask, {'role': 'assistant', 'tool_calls': [call]}]})
        assert code in (400, 422) and r['error']['param'] != 'body', (call, r)
        assert code == 422 or 'messages.1.tool_calls.0' in r['error']['message'], (call, r)
    code, r = post(app, '/v1/chat/completions', {'model': 'tiny', 'max_tokens': 2, 'messages': [ask, {'role': 'assistant', 'tool_calls': [
        {'id': 'c', 'type': 'function', 'function': {'name': 'f', 'arguments': '{not json'}}]}, {'role': 'tool', 'tool_call_id': 'c', 'content': '1'}]})
    assert code == 200, r                                  # arguments that are not JSON are shown as the text they are
    assert healthy(aeng)

def test_allof_and_deep_schemas(served):
    app, aeng = served
    schema = {'allOf': [{'type': 'object', 'properties': {'a': {'type': 'integer', 'minimum': 0, 'maximum': 9}}, 'required': ['a']},
                        {'type': 'object', 'properties': {'b': {'type': 'boolean'}}, 'required': ['b']}]}
    code, r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 60, 'temperature': 0, 'guided_json': schema})
    assert code == 200, r
    if r['choices'][0]['finish_reason'] == 'stop': assert set(json.loads(r['choices'][0]['text'])) >= {'a', 'b'}
    code, r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 2, 'guided_json': '{"items": ' * 3000 + '{}' + '}' * 3000})
    assert code == 400 and 'nested too deeply' in r['error']['message']
    assert healthy(aeng)

def test_a_grammar_that_ends_on_eos_with_ignore_eos_leaves_it_out(served):
    app, aeng = served
    code, r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 10, 'guided_choice': ['yes'], 'ignore_eos': True,
                                             'skip_special_tokens': False})
    assert code == 200 and r['choices'][0]['text'] == 'yes' and r['usage']['completion_tokens'] <= 3, r
    assert healthy(aeng)
