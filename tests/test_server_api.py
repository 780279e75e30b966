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

def test_logprobs_are_the_models(app, tiny):
    "Each token's logprob equals transformers' log-softmax at that position, and the top ones are the largest of them."
    import torch, transformers
    path = tiny('llama_tied_gqa')
    r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 4, 'logprobs': 3, 'temperature': 0}).json()
    lp = r['choices'][0]['logprobs']
    out = Engine.build(path, dtype='float32').generate(['hello'], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad(): ref = hf(torch.tensor([out.prompt_token_ids + out.token_ids])).logits[0].log_softmax(-1)
    n = len(out.prompt_token_ids)
    want = [float(ref[n - 1 + i, t]) for i, t in enumerate(out.token_ids)]
    assert len(lp['token_logprobs']) == 4 and all(abs(a - b) < 1e-4 for a, b in zip(lp['token_logprobs'], want)), (lp['token_logprobs'], want)
    for i, top in enumerate(lp['top_logprobs']):
        best = sorted(ref[n - 1 + i].tolist(), reverse=True)[:3]
        assert abs(lp['token_logprobs'][i] - best[0]) < 1e-4                            # greedy: the likeliest token
        assert all(any(abs(v - b) < 1e-4 for b in best) for v in top.values()), (top, best)   # every reported one is among the top 3

def test_stop_string_over_http(app, tiny):
    full = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'abc', 'max_tokens': 12, 'temperature': 0}).json()['choices'][0]['text']
    stop = full[3:5]
    r = post(app, '/v1/completions', {'model': 'tiny', 'prompt': 'abc', 'max_tokens': 12, 'temperature': 0, 'stop': stop}).json()['choices'][0]
    assert (r['text'], r['finish_reason']) == (full[:full.find(stop)], 'stop')

TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system\nTOOLS {{ tools | map(attribute='function') | map(attribute='name') | join(',') }}<|im_end|>\n{% endif %}"
                  "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")

def test_a_template_that_knows_tools_is_given_them(tmp_path, tiny):
    "Llama 3.1 / Qwen 2.5 style: the template reads `tools`; the server passes them instead of writing them into a system message."
    import shutil
    path = tmp_path/'tools_tiny'; shutil.copytree(tiny('llama_tied_gqa'), path)
    (path/'tokenizer_config.json').write_text(json.dumps({'chat_template': TOOLS_TEMPLATE, 'eos_token': '<|im_end|>'}))
    app, aeng = build_app(str(path), served_model_name='tiny', max_batch_size=2, dtype='float32')
    try:
        assert aeng.chat_knows_tools
        fn = {'type': 'function', 'function': {'name': 'lookup', 'parameters': {'type': 'object', 'properties': {'q': {'type': 'string', 'maxLength': 5}},
                                                                                   'required': ['q']}}}
        msgs = [{'role': 'user', 'content': 'hello'}]
        want = aeng.encode_chat(msgs, [fn])
        assert aeng.engine.tokenizer.decode(want, skip_special_tokens=False).startswith('<|im_start|>system\nTOOLS lookup')
        r = post(app, '/v1/chat/completions', {'model': 'tiny', 'messages': msgs, 'tools': [fn], 'max_tokens': 40, 'temperature': 0,
                                               'tool_choice': {'type': 'function', 'function': {'name': 'lookup'}}}).json()
        assert r['usage']['prompt_tokens'] == len(want)                     # the prompt is the template's rendering with the tools
        call = r['choices'][0]['message']['tool_calls'][0]
        assert call['function']['name'] == 'lookup' and set(json.loads(call['function']['arguments'])) == {'q'}
        plain = post(app, '/v1/chat/completions', {'model': 'tiny', 'messages': msgs, 'max_tokens': 2}).json()
        assert plain['usage']['prompt_tokens'] == len(aeng.encode_chat(msgs)) < len(want)   # no tools: the template leaves them out
    finally: aeng.shutdown()
