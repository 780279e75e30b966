"""OpenAI's Responses API and Anthropic's Messages API through a real server on 127.0.0.1, driven by the clients they are for (the
`openai` SDK's responses.create and responses.stream, the `anthropic` SDK's messages.create and messages.stream). The model's
tokens are forced (tests/liveapp.py) so each answer is known; everything after the forward runs as in production."""
import json
import anthropic, httpx, pytest
from openai import OpenAI
from nanoserve.launch import build_app
from liveapp import served, force_text, thinking_checkpoint

THOUGHT, ANSWER = 'The user greets me.', 'Hello there!'
OUTPUT = f'<think>{THOUGHT}</think>\n\n{ANSWER}'
CALL = '<tool_call>{"name": "now", "arguments": {"tz": "UTC"}}</tool_call>'
FN = {'name': 'now', 'description': 'the time', 'parameters': {'type': 'object', 'properties': {'tz': {'type': 'string'}}}}

@pytest.fixture(scope='module')
def live(tmp_path_factory):
    path, eos = thinking_checkpoint(tmp_path_factory.mktemp('adapters'))
    app, aeng = build_app(str(path), served_model_name='tiny', max_batch_size=4, dtype='float32', reasoning_parser='qwen3',
                          api_key='sekrit')
    eng = aeng.engine
    def say(text):
        "Force `text`, then the end of the turn; the tokens of `text`."
        ids = eng.tokenizer.encode(text, add_special_tokens=False)
        force_text(eng, ids + [eos])
        return len(ids)
    real = eng.runner.execute
    with served(app) as url:
        yield {'url': url, 'say': say, 'engine': eng, 'openai': OpenAI(base_url=url + '/v1', api_key='sekrit'),
               'anthropic': anthropic.Anthropic(base_url=url, api_key='sekrit')}
        eng.runner.execute = real
    aeng.shutdown()

HI = [{'role': 'user', 'content': 'hi'}]

# the Responses API

def test_responses_create(live):
    n = live['say'](OUTPUT)
    r = live['openai'].responses.create(model='tiny', input='hi', instructions='Be brief.', max_output_tokens=n + 5)
    assert r.status == 'completed' and r.output_text == ANSWER and r.incomplete_details is None
    assert [o.type for o in r.output] == ['reasoning', 'message'] and r.output[0].content[0].text == THOUGHT
    assert r.usage.output_tokens == n          # the thought and the answer (the end of the turn is not output)
    cut = live['openai'].responses.create(model='tiny', input='hi', max_output_tokens=n - 3)
    assert r.usage.input_tokens > cut.usage.input_tokens        # the instructions are in the prompt
    assert cut.status == 'incomplete' and cut.incomplete_details.reason == 'max_output_tokens'
    assert cut.output_text == ANSWER[:-3]

def test_responses_stream(live):
    n = live['say'](OUTPUT)
    with live['openai'].responses.stream(model='tiny', input=[{'role': 'user', 'content': 'hi'}], max_output_tokens=n) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ['response.created', 'response.in_progress'] and kinds[-1] == 'response.completed'
    assert ''.join(e.delta for e in events if e.type == 'response.output_text.delta') == ANSWER == final.output_text
    assert ''.join(e.delta for e in events if e.type == 'response.reasoning_text.delta') == THOUGHT
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds.count('response.output_item.added') == kinds.count('response.output_item.done') == 2

def test_responses_function_tools_round_trip(live):
    n = live['say'](CALL)
    tool = {'type': 'function', **FN}
    r = live['openai'].responses.create(model='tiny', input='time?', tools=[tool], max_output_tokens=n)
    call = next(o for o in r.output if o.type == 'function_call')
    assert (call.name, json.loads(call.arguments)) == ('now', {'tz': 'UTC'})
    with live['openai'].responses.stream(model='tiny', input='time?', tools=[tool], max_output_tokens=n) as s:
        final = s.get_final_response()
    assert [(o.type, o.name) for o in final.output if o.type == 'function_call'] == [('function_call', 'now')]
    live['say'](ANSWER)
    after = live['openai'].responses.create(model='tiny', tools=[tool], max_output_tokens=5, input=[
        {'role': 'user', 'content': 'time?'}, {'type': 'function_call', 'call_id': call.call_id, 'name': 'now', 'arguments': call.arguments},
        {'type': 'function_call_output', 'call_id': call.call_id, 'output': '12:00'}])
    assert after.output_text == ANSWER[:len(after.output_text)] and after.output_text

def test_responses_are_stored(live):
    "Kept in memory: GET /v1/responses/{id} answers it, and previous_response_id puts its conversation before the new input."
    n = live['say'](ANSWER)
    first = live['openai'].responses.create(model='tiny', input='hi', max_output_tokens=n)
    assert live['openai'].responses.retrieve(first.id).output_text == first.output_text == ANSWER
    again = live['openai'].responses.create(model='tiny', input='and?', max_output_tokens=n, previous_response_id=first.id)
    alone = live['openai'].responses.create(model='tiny', input='and?', max_output_tokens=n)
    assert again.usage.input_tokens > alone.usage.input_tokens + n     # the first question and its answer came before
    r = httpx.get(live['url'] + '/v1/responses/resp_nope', headers={'Authorization': 'Bearer sekrit'})
    assert r.status_code == 404 and 'not stored' in r.json()['error']['message']

def test_responses_refusals(live):
    from openai import BadRequestError
    with pytest.raises(BadRequestError, match="a 'web_search' tool cannot be used"):
        live['openai'].responses.create(model='tiny', input='hi', tools=[{'type': 'web_search'}])
    with pytest.raises(BadRequestError, match="input.0.type 'image_generation_call'"):
        live['openai'].responses.create(model='tiny', input=[{'type': 'image_generation_call', 'id': 'x'}])

# Anthropic's Messages API

def test_messages_create(live):
    n = live['say'](OUTPUT)
    m = live['anthropic'].messages.create(model='tiny', max_tokens=n + 5, system='Be brief.', messages=HI)
    assert [b.type for b in m.content] == ['thinking', 'text']
    assert (m.content[0].thinking, m.content[1].text, m.stop_reason) == (THOUGHT, ANSWER, 'end_turn')
    assert m.usage.output_tokens == n and m.usage.input_tokens + m.usage.cache_read_input_tokens > 0
    cut = live['anthropic'].messages.create(model='tiny', max_tokens=n - 3, messages=HI)
    assert (cut.content[-1].text, cut.stop_reason) == (ANSWER[:-3], 'max_tokens')

def test_messages_stop_sequence(live):
    live['say'](OUTPUT)
    m = live['anthropic'].messages.create(model='tiny', max_tokens=200, messages=HI, stop_sequences=['there'],
                                          thinking={'type': 'disabled'})
    assert (m.stop_reason, m.stop_sequence) == ('stop_sequence', 'there')
    assert [b.type for b in m.content] == ['text'] and m.content[0].text.endswith('Hello ')   # thinking off: no split

def test_messages_stream(live):
    n = live['say'](OUTPUT)
    with live['anthropic'].messages.stream(model='tiny', max_tokens=n + 5, messages=HI) as s:
        text = ''.join(s.text_stream)
        final = s.get_final_message()
    assert text == ANSWER and [b.type for b in final.content] == ['thinking', 'text'] and final.content[0].thinking == THOUGHT
    assert final.stop_reason == 'end_turn' and final.usage.output_tokens == n

def test_messages_tool_use_round_trip(live):
    n = live['say'](CALL)
    tools = [{'name': 'now', 'description': 'the time', 'input_schema': FN['parameters']}]
    m = live['anthropic'].messages.create(model='tiny', max_tokens=n + 1, messages=[{'role': 'user', 'content': 'time?'}], tools=tools)
    use = next(b for b in m.content if b.type == 'tool_use')
    assert (use.name, use.input, m.stop_reason) == ('now', {'tz': 'UTC'}, 'tool_use')
    with live['anthropic'].messages.stream(model='tiny', max_tokens=n + 1, messages=[{'role': 'user', 'content': 'time?'}], tools=tools) as s:
        final = s.get_final_message()
    assert [(b.type, b.input) for b in final.content if b.type == 'tool_use'] == [('tool_use', {'tz': 'UTC'})]
    live['say'](ANSWER)
    after = live['anthropic'].messages.create(model='tiny', max_tokens=5, tools=tools, messages=[
        {'role': 'user', 'content': 'time?'}, {'role': 'assistant', 'content': [b.model_dump() for b in m.content]},
        {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': use.id, 'content': '12:00'}]}])
    assert after.content[0].text and ANSWER.startswith(after.content[0].text)

def test_messages_errors_in_anthropics_shape(live):
    with pytest.raises(anthropic.BadRequestError) as e:
        live['anthropic'].messages.create(model='tiny', max_tokens=0, messages=HI)
    assert e.value.body['type'] == 'error' and e.value.body['error']['type'] == 'invalid_request_error'
    r = httpx.post(live['url'] + '/v1/messages', headers={'x-api-key': 'sekrit'}, json={'model': 'tiny', 'messages': HI})
    assert r.status_code == 400 and r.json()['error']['type'] == 'invalid_request_error' and 'max_tokens' in r.json()['error']['message']
    with pytest.raises(anthropic.NotFoundError):
        live['anthropic'].messages.create(model='other', max_tokens=4, messages=HI)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=live['url'], api_key='wrong').messages.create(model='tiny', max_tokens=4, messages=HI)
    with pytest.raises(anthropic.BadRequestError, match="a 'image' block cannot be used"):
        live['anthropic'].messages.create(model='tiny', max_tokens=4, messages=[{'role': 'user', 'content': [
            {'type': 'image', 'source': {'type': 'base64', 'media_type': 'image/png', 'data': 'AAAA'}}]}])

def test_nothing_leaks(live):
    s = httpx.get(live['url'] + '/health').json()['stats']
    assert (s['num_running'], s['num_waiting'], s['kv_free_blocks']) == (0, 0, s['kv_total_blocks'])

def test_streams_never_send_the_start_of_a_stop_string(live):
    "'Hello the' is held back until 're' shows it was the stop string: every stream says what the whole answer says."
    live['say'](ANSWER)
    chat = live['openai'].chat.completions.create(model='tiny', messages=HI, stop=['there'], stream=True)
    streamed = ''.join(c.choices[0].delta.content or '' for c in chat if c.choices)
    whole = live['openai'].chat.completions.create(model='tiny', messages=HI, stop=['there']).choices[0].message.content
    with live['anthropic'].messages.stream(model='tiny', max_tokens=50, messages=HI, stop_sequences=['there']) as s:
        text = ''.join(s.text_stream)
    assert streamed == whole == text == 'Hello '
