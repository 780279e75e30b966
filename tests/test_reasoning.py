"""`--reasoning-parser`: a thinking model's thought split from its answer, through a real server on 127.0.0.1 and the real
`openai` client; the model's tokens are forced (tests/liveapp.py) so that it writes a thought, and everything after the
forward runs as it does in production."""
import httpx, pytest
from openai import OpenAI
from nanoserve.launch import build_app
from liveapp import served, force_text, thinking_checkpoint
THOUGHT, ANSWER = '\nThe user says hi; </th is no tag.\n', 'Hello there!'
OUTPUT = f'<think>{THOUGHT}</think>\n\n{ANSWER}'
CALL = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
TOOLS = [{'type': 'function', 'function': {'name': 'now', 'description': 'the time',
                                           'parameters': {'type': 'object', 'properties': {}}}}]

@pytest.fixture(scope='module')
def live(tmp_path_factory):
    path, _ = thinking_checkpoint(tmp_path_factory.mktemp('think'))   # its end of turn is never forced here
    app, aeng = build_app(str(path), served_model_name='tiny', max_batch_size=4, dtype='float32',
                          reasoning_parser='qwen3')
    state = {'engine': aeng.engine, 'served': app.state.served}
    def say(text):
        state['text'] = text
        force_text(aeng.engine, aeng.engine.tokenizer.encode(text, add_special_tokens=False))
        return len(aeng.engine.tokenizer.encode(text, add_special_tokens=False))
    state['say'] = say
    real = aeng.engine.runner.execute
    with served(app) as url:
        state['client'] = OpenAI(base_url=url + '/v1', api_key='none')
        state['url'] = url
        yield state
        aeng.engine.runner.execute = real
    aeng.shutdown()

def ask(live, text, **kw):
    n = live['say'](text)
    kw.setdefault('max_tokens', n)
    return live['client'].chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': 'hi'}], **kw)

def stream(live, text, **kw):
    n = live['say'](text)
    kw.setdefault('max_tokens', n)
    chunks = list(live['client'].chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': 'hi'}],
                                                         stream=True, **kw))
    pick = lambda k: ''.join((getattr(c.choices[0].delta, k, None) or c.choices[0].delta.model_extra.get(k) or '')
                             for c in chunks if c.choices)
    return chunks, pick

def test_thought_and_answer_apart(live):
    m = ask(live, OUTPUT).choices[0].message
    assert (m.model_extra['reasoning'], m.content) == (THOUGHT, ANSWER)
    assert m.model_extra['reasoning_content'] == THOUGHT            # the older name, for older clients

def test_streamed_thought_and_answer_apart(live):
    chunks, pick = stream(live, OUTPUT)
    assert (pick('reasoning'), pick('content')) == (THOUGHT, ANSWER)
    assert pick('reasoning_content') == THOUGHT
    assert chunks[-1].choices[0].finish_reason == 'length'
    # the thought streams as it comes: more than one chunk carries a piece of it
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.model_extra.get('reasoning')) > 1

def test_max_tokens_counts_the_thought(live):
    "Cut off inside its thought: a reasoning and no content, finish_reason length, the thought's tokens counted."
    n = live['say'](OUTPUT)
    r = live['client'].chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': 'hi'}], max_tokens=12)
    m = r.choices[0].message
    assert m.content is None and m.model_extra['reasoning'] and r.choices[0].finish_reason == 'length'
    assert r.usage.completion_tokens == 12 < n
    assert OUTPUT.startswith('<think>' + m.model_extra['reasoning'])

def test_tool_calls_parse_the_answer_only(live):
    "A thought that mentions a call is not a call; the answer's call is parsed, whole and streamed."
    text = f'<think>Maybe {CALL}? No: I will call it below.</think>\n\n{CALL}'
    r = ask(live, text, tools=TOOLS)
    c = r.choices[0]
    assert [t.function.name for t in c.message.tool_calls] == ['now'] and c.finish_reason == 'length'
    assert c.message.model_extra['reasoning'] == f'Maybe {CALL}? No: I will call it below.'
    chunks, pick = stream(live, text, tools=TOOLS)
    assert pick('reasoning') == f'Maybe {CALL}? No: I will call it below.'
    calls = [t for ch in chunks if ch.choices for t in (ch.choices[0].delta.tool_calls or [])]
    assert [t.function.name for t in calls] == ['now'] and pick('content') == ''

def test_enable_thinking_reaches_the_template(live):
    "chat_template_kwargs go to the template (Qwen3's empty thought in the prompt) and turn the split off."
    body = {'model': 'tiny', 'messages': [{'role': 'user', 'content': 'hi'}]}
    tok = lambda **kw: httpx.post(live['url'] + '/tokenize', json={**body, **kw}).json()['tokens']
    off = live['engine'].tokenizer.decode(tok(chat_template_kwargs={'enable_thinking': False}))
    assert off.endswith('<think>\n\n</think>\n\n') and not live['engine'].tokenizer.decode(tok()).endswith('</think>\n\n')
    m = ask(live, OUTPUT, extra_body={'chat_template_kwargs': {'enable_thinking': False}}).choices[0].message
    assert m.content == OUTPUT and m.model_extra.get('reasoning') is None

def test_a_template_variable_the_body_owns_is_refused(live):
    r = httpx.post(live['url'] + '/v1/chat/completions', json={
        'model': 'tiny', 'messages': [{'role': 'user', 'content': 'hi'}], 'chat_template_kwargs': {'messages': []}})
    assert r.status_code == 400 and "'messages'" in r.json()['error']['message']
    assert r.json()['error']['param'] == 'chat_template_kwargs'

def test_deepseek_r1_output_starts_inside_its_thought(live):
    live['served'].reasoning_parser = 'deepseek_r1'
    try:
        m = ask(live, f'{THOUGHT}</think>\n\n{ANSWER}').choices[0].message
        assert (m.model_extra['reasoning'], m.content) == (THOUGHT, ANSWER)
        _, pick = stream(live, f'{THOUGHT}</think>\n\n{ANSWER}')
        assert (pick('reasoning'), pick('content')) == (THOUGHT, ANSWER)
    finally: live['served'].reasoning_parser = 'qwen3'

def test_no_parser_no_split(live):
    live['served'].reasoning_parser = None
    try:
        m = ask(live, OUTPUT).choices[0].message
        assert m.content == OUTPUT and 'reasoning' not in (m.model_extra or {})
    finally: live['served'].reasoning_parser = 'qwen3'

def test_nothing_leaks(live):
    s = httpx.get(live['url'] + '/health').json()['stats']
    assert (s['num_running'], s['num_waiting'], s['kv_free_blocks']) == (0, 0, s['kv_total_blocks'])
