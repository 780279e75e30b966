"""LoRA adapters (Days 73-74): adapters made by PEFT itself against PEFT's merged model run by transformers, a request's
bits alone and in a crowd of other adapters, the prefix cache keyed by adapter, the other parts of the engine with
adapters, a real server with the openai client (listed, chosen by `model`, loaded and unloaded at run time, mixed in one
crowd, /metrics), and every refusal with its message. The CPU paths covered are named by each test's `paths`."""
import asyncio, json, subprocess, sys, threading
from pathlib import Path
import httpx, openai, pytest, torch, transformers
from nanoserve.core import ConfigError, RequestError
from nanoserve.engine import Engine, EngineConfig
from nanoserve.launch import build_engine, build_app, parse_lora_modules
from nanoserve.loadgen import spawn_server
from nanoserve.sampling import SamplingParams
from nanoserve.lora_batch import LoraError, random_adapter, lora_kernel
from nanoserve.config import ModelConfig
from liveapp import served
from conftest import make_tiny

peft = pytest.importorskip('peft')
NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
ALL = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']

@pytest.fixture(scope='module')
def peaky(tmp_path_factory):
    """A tiny checkpoint of head size 16 (the decode call's and the decode kernel's, so the batch-invariant mode and
    the decode call run on it) whose logits are far apart (its final norm scaled up), so last-bit differences cannot
    flip a greedy token."""
    path = make_tiny(tmp_path_factory.mktemp('peaky16'), 'llama_untied_mha', seed=3)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad(): model.model.norm.weight.mul_(12)
    model.save_pretrained(path)
    return path

def peft_adapter(base: Path, out: Path, targets, r: int = 8, alpha: float = 16, rslora: bool = False, seed: int = 0,
                 layers=None) -> Path:
    """An adapter made by PEFT on `base` (A and B both random: `init_lora_weights=False`, so the delta is not zero),
    saved in PEFT's files."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora, lora_dropout=0.0,
                          init_lora_weights=False, layers_to_transform=layers, task_type='CAUSAL_LM')
    pm = peft.get_peft_model(model, cfg)
    with torch.no_grad():                      # PEFT's random B is large for a tiny model: keep the delta moderate
        for n, p in pm.named_parameters():
            if 'lora_B' in n: p.mul_(0.05)
    pm.save_pretrained(out)
    return out

def merged_model(base: Path, adapter: Path):
    "PEFT's own merge of `adapter` into `base` (merge_and_unload), float32."
    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    return peft.PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()

def reference_tokens(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    "transformers' greedy tokens after `prompt` and each one's log-probability."
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                             eos_token_id=None)[0, len(prompt):].tolist()
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1].float()
    lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0]
    return out, lp.tolist()

def logprob_of(o) -> list[float]: return [lp[t] for t, lp in zip(o.token_ids, o.logprobs)]

PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42], [100, 3, 100, 3, 100, 3, 17], [7] * 20]

@pytest.mark.parametrize('targets,rslora', [(ALL, False), (ALL, True), (['q_proj', 'v_proj'], False),
                                            (['k_proj', 'o_proj'], False), (['gate_proj', 'up_proj'], False),
                                            (['down_proj'], True)])
def test_float32_matches_peft_merged_model(peaky, tmp_path, targets, rslora):
    """Tokens equal and logprobs equal to float32 rounding against PEFT's merged model run by transformers, for each
    target set and rsLoRA; through the decode call (paths: the float32 kernels, `lora_add`) and the layers."""
    adapter = peft_adapter(peaky, tmp_path/'a', targets, r=8, alpha=16, rslora=rslora, seed=1)
    merged = merged_model(peaky, adapter)
    want = [reference_tokens(merged, p, 12) for p in PROMPTS]
    base = transformers.AutoModelForCausalLM.from_pretrained(peaky, torch_dtype=torch.float32)
    # the adapter matters: the base gives other tokens or other logprobs
    assert [reference_tokens(base, p, 12) for p in PROMPTS] != want
    for decode_call in (True, False):
        engine = Engine.build(peaky, dtype='float32', enable_lora=True, decode_call=decode_call)
        assert (engine.runner.decode_call is not None) == decode_call, engine.runner.decode_call_off
        engine.load_adapter('a', adapter)
        outs = engine.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0, logprobs=1), use_tqdm=False,
                               lora='a')
        for o, (tokens, lps) in zip(outs, want):
            assert o.token_ids == tokens
            torch.testing.assert_close(torch.tensor(logprob_of(o)), torch.tensor(lps), atol=2e-4, rtol=0)

def test_layers_to_transform_and_peft_config_fields(peaky, tmp_path):
    "An adapter on some layers only (layers_to_transform), read from the config PEFT writes, equals the merged model."
    adapter = peft_adapter(peaky, tmp_path/'a', ['q_proj', 'up_proj'], r=4, alpha=8, seed=2, layers=[1])
    want = reference_tokens(merged_model(peaky, adapter), PROMPTS[0], 10)
    engine = Engine.build(peaky, dtype='float32', enable_lora=True)
    assert engine.load_adapter('a', adapter).spec.layers == (1,)
    o = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=10, temperature=0, logprobs=1), use_tqdm=False,
                        lora='a')[0]
    assert o.token_ids == want[0]
    torch.testing.assert_close(torch.tensor(logprob_of(o)), torch.tensor(want[1]), atol=2e-4, rtol=0)

def five_adapters(base: Path, tmp: Path) -> list[Path]:
    cfg = ModelConfig.from_dir(base)
    sets = [ALL, ['q_proj', 'v_proj'], ['gate_proj', 'up_proj', 'down_proj'], ['o_proj'], ALL]
    return [random_adapter(tmp/f'a{i}', cfg, t, rank=4 + 4 * (i % 3), std=0.1, seed=i) for i, t in enumerate(sets)]

@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_batch_invariant_alone_equals_in_a_crowd_of_four_adapters(peaky, tmp_path, dtype):
    """Bit for bit, tokens and logprobs: a sampled request under one adapter alone, and beside four requests of four
    other adapters, three more of its own and one of the base, through the decode call and through the layers."""
    paths = five_adapters(peaky, tmp_path)
    params = SamplingParams(max_tokens=16, temperature=0.8, seed=7, logprobs=2)
    for decode_call in (True, False):
        engine = Engine.build(peaky, dtype=dtype, enable_lora=True, max_loras=5, decode_call=decode_call)
        if engine.runner.invariance['how'] != 'fixed-order kernels':
            pytest.skip(f"the batch-invariant mode's kernels do not run {dtype} here: {engine.runner.invariance}")
        for i, p in enumerate(paths): engine.load_adapter(f'a{i}', p)
        alone = engine.generate([PROMPTS[0]], params, use_tqdm=False, lora='a0')[0]
        # a0's request beside three more of a0 (the kernel's four-row path), four of other adapters, one of the base
        crowd = engine.generate([PROMPTS[0], *PROMPTS[1:], [9, 9, 8], [3, 4], [11, 12], [13], [14, 15, 16]], params,
                                use_tqdm=False, lora=['a0', 'a1', 'a2', 'a3', 'a4', None, 'a0', 'a0', 'a0'])
        assert max(engine.steps_by_batch) >= 5                        # they did share steps
        assert crowd[0].token_ids == alone.token_ids and crowd[0].logprobs == alone.logprobs
        base = engine.generate([PROMPTS[0]], params, use_tqdm=False)[0]
        assert base.token_ids != alone.token_ids

def test_prefix_cache_never_shares_blocks_across_adapters(peaky, tmp_path):
    """The same 48-token prompt under adapter a, the base, adapter b, then a again: only the last finds cached blocks,
    and every answer is what an engine without a prefix cache gives (were blocks shared, b would read a's K/V)."""
    a, b = five_adapters(peaky, tmp_path)[:2]
    prompt, params = list(range(20, 68)), SamplingParams(max_tokens=8, temperature=0, logprobs=1)
    engines = [Engine.build(peaky, dtype='float32', enable_lora=True, prefix_cache=on) for on in (True, False)]
    for e in engines:
        e.load_adapter('a', a)
        e.load_adapter('b', b)
    got = [engines[0].generate([prompt], params, use_tqdm=False, lora=l)[0] for l in ('a', None, 'b', 'a')]
    assert [o.num_cached_tokens for o in got] == [0, 0, 0, 32]
    plain = [engines[1].generate([prompt], params, use_tqdm=False, lora=l)[0] for l in ('a', None, 'b', 'a')]
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    assert [o.logprobs for o in got] == [o.logprobs for o in plain]
    # unloaded and loaded again under the same name from the same files: a new key, nothing found
    engines[0].unload_adapter('a')
    engines[0].load_adapter('a', a)
    assert engines[0].generate([prompt], params, use_tqdm=False, lora='a')[0].num_cached_tokens == 0

def test_preemption_speculation_and_structured_output_with_adapters(peaky, tmp_path):
    """A pool small enough to preempt, ngram speculation, and a JSON schema, each with adapters in the crowd: the same
    tokens as the plain engine (greedy), and the schema's output valid."""
    paths = five_adapters(peaky, tmp_path)[:3]
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6], [40, 41, 42, 40, 41, 42, 40], [9] * 12, [3, 4, 5]]
    loras = ['a0', 'a1', 'a2', None]
    params = SamplingParams(max_tokens=40, temperature=0)
    def run(**kw):
        e = Engine.build(peaky, dtype='float32', enable_lora=True, **kw)
        for i, p in enumerate(paths): e.load_adapter(f'a{i}', p)
        return e, [o.token_ids for o in e.generate(prompts, params, use_tqdm=False, lora=loras)]
    _, want = run()
    small, got = run(num_kv_blocks=8, block_size=8)
    assert small.scheduler.num_preemptions > 0 and got == want
    spec, got = run(speculative='ngram')
    assert spec.scheduler.num_accepted_tokens > 0 and got == want
    schema = {'type': 'object', 'properties': {'n': {'type': 'boolean'}}, 'required': ['n'],
              'additionalProperties': False}
    from nanoserve.grammar import Structured
    e, _ = run()
    constrained = SamplingParams(max_tokens=30, temperature=0, structured=Structured.json_schema(schema))
    out = e.generate([[5, 6, 7]], constrained, use_tqdm=False, lora='a1')[0]
    assert set(json.loads(out.text)) == {'n'}

@pytest.mark.parametrize('quantization', ['int8', 'int4'])
def test_quantized_base_takes_adapters(peaky, tmp_path, quantization):
    """A quantized base (int8, int4) with a bfloat16 adapter (how QLoRA fine-tunes are served): the decode call and
    the layers give the same bits, the adapter changes the answer, and the kernel agrees with the PyTorch reference."""
    path = five_adapters(peaky, tmp_path)[0]
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=1)
    outs = []
    for decode_call in (True, False):
        e = build_engine(peaky, dtype='bfloat16', quantization=quantization, enable_lora=True, decode_call=decode_call)
        e.load_adapter('a', path)
        assert e.model.lora.dtype == torch.bfloat16
        outs.append(e.generate(PROMPTS, params, use_tqdm=False, lora='a'))
    assert [(o.token_ids, o.logprobs) for o in outs[0]] == [(o.token_ids, o.logprobs) for o in outs[1]]
    assert [o.token_ids for o in e.generate(PROMPTS, params, use_tqdm=False)] != [o.token_ids for o in outs[1]]
    if lora_kernel() is not None:
        e.model.lora.kernel = None                                   # the PyTorch reference, grouped by slot
        top = SamplingParams(max_tokens=1, temperature=0, logprobs=5)
        ref = e.generate(PROMPTS, top, use_tqdm=False, lora='a')
        e.model.lora.kernel = lora_kernel()
        got = e.generate(PROMPTS, top, use_tqdm=False, lora='a')
        for o, r in zip(got, ref):
            # the reference rounds h and the delta to bfloat16 as PEFT does, the kernel once: the first position's
            # logprobs equal to bfloat16's rounding (amplified twelvefold by this model's final norm)
            both = sorted(set(o.logprobs[0]) & set(r.logprobs[0]))
            assert len(both) >= 3
            torch.testing.assert_close(torch.tensor([o.logprobs[0][t] for t in both]),
                                       torch.tensor([r.logprobs[0][t] for t in both]), atol=0.15, rtol=0)

def test_refusals_of_adapters_with_their_messages(peaky, tiny, tmp_path):
    "Each refusal names what was found and what is served, before anything changes."
    engine = Engine.build(peaky, dtype='float32', enable_lora=True, max_loras=1, max_lora_rank=16)
    good = peft_adapter(peaky, tmp_path/'good', ['q_proj'], r=4)
    def refused(path, *words):
        with pytest.raises(LoraError) as e: engine.load_adapter('x', path)
        for w in words: assert w in str(e.value), str(e.value)
        assert engine.lora.by_name == {}
    other = peft_adapter(tiny('llama_tied_gqa'), tmp_path/'other', ['k_proj'], r=4)
    cfg = json.loads((other/'adapter_config.json').read_text())
    refused(other, 'does not fit this base')
    for key, value, words in [('use_dora', True, ['DoRA']), ('target_modules', ['q_proj', 'embed_tokens'],
                                                               ["['embed_tokens']", 'nanoserve serves LoRA on']),
                              ('modules_to_save', ['lm_head'], ['modules_to_save', 'LM head']),
                              ('r', 32, ['rank r=32', '1 to 16 (--max-lora-rank)']),
                              ('peft_type', 'IA3', ['peft_type', 'LORA'])]:
        bad = tmp_path/f'bad-{key}'
        bad.mkdir()
        (bad/'adapter_config.json').write_text(json.dumps({**json.loads((good/'adapter_config.json').read_text()),
                                                           key: value}))
        (bad/'adapter_model.safetensors').write_bytes((good/'adapter_model.safetensors').read_bytes())
        refused(bad, *words)
    refused(tmp_path/'nowhere', 'is not a directory')
    corrupt = tmp_path/'corrupt'
    corrupt.mkdir()
    (corrupt/'adapter_config.json').write_text((good/'adapter_config.json').read_text())
    (corrupt/'adapter_model.safetensors').write_bytes(b'not a safetensors file')
    refused(corrupt, "adapter 'x'")
    refused(peaky, 'has no adapter_config.json')
    assert cfg['peft_type'] == 'LORA'
    engine.load_adapter('x', good)
    with pytest.raises(LoraError, match='already loaded'): engine.load_adapter('x', good)
    with pytest.raises(LoraError, match='all 1 adapter slots are in use'): engine.load_adapter('y', good)
    with pytest.raises(LoraError, match="no adapter named 'y' is loaded") as e: engine.unload_adapter('y')
    assert e.value.status == 404
    with pytest.raises(RequestError, match="no adapter named 'nope'"): engine.add_request([5, 6], lora='nope')
    assert not engine.scheduler.requests
    rid = engine.add_request([5, 6], SamplingParams(max_tokens=4), lora='x')
    with pytest.raises(LoraError, match='serving 1 unfinished request') as e: engine.unload_adapter('x')
    assert e.value.status == 409 and rid in str(e.value)
    plain = Engine.build(peaky, dtype='float32')
    with pytest.raises(LoraError, match='start it with --enable-lora'): plain.add_request([5], lora='x')
    moe = tiny('qwen3_moe')
    with pytest.raises(ConfigError, match='mixture of experts'): Engine.build(moe, dtype='float32', enable_lora=True)

@pytest.mark.parametrize('flags,message', [
    (dict(capture_decode=True, bucket_decode=True, persist_inputs=True), '--cuda-graphs: the capture records no'),
    (dict(bucket_decode=True), 'bucket_decode: the bucketed decode path gives its rows no adapter slots'),
    (dict(persist_inputs=True), 'persist_inputs: the bucketed decode path'),
    (dict(compile=True), "--compile: the adapters' kernel is not traced"),
    (dict(runner='pooling'), 'adapters serve text generation'),
    (dict(tensor_parallel_size=2), 'not sharded across ranks yet'),
    (dict(max_loras=0), 'max_loras (--max-loras) must be a positive integer'),
    (dict(max_lora_rank=-1), 'max_lora_rank (--max-lora-rank) must be a positive integer')])
def test_config_refusals(flags, message):
    with pytest.raises(ConfigError) as e: EngineConfig(enable_lora=True, **flags)
    assert message in str(e.value)

def test_lora_modules_forms_and_refusals():
    assert parse_lora_modules(['a=/x', '{"name": "b", "path": "/y", "base_model_name": "org/base"}']) == [
        ('a', '/x', None), ('b', '/y', 'org/base')]
    for bad, message in [('a', 'give name=path'), ('=p', 'give name=path'), ('{"name": "a"}', 'the JSON form has'),
                         ('{"name": "a", ', 'not valid JSON')]:
        with pytest.raises(ConfigError, match=message): parse_lora_modules([bad])
    with pytest.raises(ConfigError, match='each adapter needs its own name'): parse_lora_modules(['a=/x', 'a=/y'])

def test_server_lists_chooses_loads_unloads_and_mixes_adapters(peaky, tmp_path):
    """A real server on 127.0.0.1 and the openai client: the adapters of --lora-modules listed with their parent,
    chosen by `model`; one loaded and one unloaded while it runs, the refusals' statuses; a crowd of three adapters
    and the base, each answer the one it gets alone; `vllm:lora_requests_info` while a request runs."""
    a, b, c = five_adapters(peaky, tmp_path)[:3]
    app, aeng = build_app(str(peaky), EngineConfig(dtype='float32', max_loras=3), 'tiny', enable_lora=True,
                          lora_modules=[f'sql={a}', json.dumps({'name': 'chat', 'path': str(b),
                                                                'base_model_name': 'org/tiny'})])
    try:
        with served(app) as url:
            client = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
            models = {m.id: m for m in client.models.list().data}
            assert set(models) == {'tiny', 'sql', 'chat'}
            assert (models['sql'].parent, models['sql'].root, models['chat'].parent) == ('tiny', str(a), 'org/tiny')
            ask = lambda model, p=[5, 6, 7, 8], n=16: client.completions.create(model=model, prompt=p, max_tokens=n,
                                                                              temperature=0).choices[0].text
            alone = {m: ask(m) for m in ('tiny', 'sql', 'chat')}
            assert len(set(alone.values())) == 3
            with pytest.raises(openai.NotFoundError, match="'sqll' is not served here"): ask('sqll')
            # loaded at run time: 400s for a name in use, a bad path, a full set of slots
            post = lambda route, **body: httpx.post(f'{url}/v1/{route}', json=body, timeout=60)
            assert post('load_lora_adapter', lora_name='sql', lora_path=str(c)).status_code == 400
            r = post('load_lora_adapter', lora_name='code', lora_path=str(tmp_path/'missing'))
            assert r.status_code == 400 and 'is not a directory' in r.json()['error']['message']
            r = post('load_lora_adapter', lora_name='code', lora_path=str(c))
            assert r.status_code == 200 and "'code'" in r.text
            assert post('load_lora_adapter', lora_name='more', lora_path=str(c)).status_code == 400
            alone['code'] = ask('code')
            assert 'code' in {m.id for m in client.models.list().data}
            # a crowd of three adapters and the base: each answer the one it got alone
            async def crowd():
                ac = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
                models = ['sql', 'chat', 'code', 'tiny'] * 2
                rs = await asyncio.gather(*[ac.completions.create(model=m, prompt=[5, 6, 7, 8], max_tokens=16,
                                                                  temperature=0) for m in models])
                return [r.choices[0].text for r in rs]
            assert asyncio.run(crowd()) == [alone[m] for m in ['sql', 'chat', 'code', 'tiny'] * 2]
            assert max(aeng.engine.steps_by_batch) >= 4
            # unloading an adapter that a request runs under: 409, and the request runs to its end under it. The
            # engine is held at that request's first decode step until the unload is in the engine's inbox, so the
            # request is certainly unfinished when the unload is applied
            started, gate, real = threading.Event(), threading.Event(), aeng.engine.runner.execute
            def execute(out):
                if any(s.adapter >= 0 and s.start > 0 for s in out.scheduled):
                    started.set()
                    gate.wait(120)
                return real(out)
            aeng.engine.runner.execute = execute
            chunks = []
            def consume():
                for ch in client.completions.create(model='code', prompt=[5, 6, 7, 8], max_tokens=60, temperature=0,
                                                    stream=True): chunks.append(ch)
            consumer = threading.Thread(target=consume)
            consumer.start()
            assert started.wait(120)
            metrics = httpx.get(url + '/metrics').text
            info = 'vllm:lora_requests_info{max_lora="3",running_lora_adapters="code",waiting_lora_adapters=""}'
            assert info in metrics
            answer = []
            unload = threading.Thread(target=lambda: answer.append(post('unload_lora_adapter', lora_name='code')))
            unload.start()
            assert aeng.wait_queued('call', 120)
            gate.set()
            unload.join(120)
            consumer.join(120)
            assert answer[0].status_code == 409 and 'run to their end under it' in answer[0].json()['error']['message']
            aeng.engine.runner.execute = real
            assert ''.join(ch.choices[0].text for ch in chunks).startswith(alone['code'])
            assert chunks[-1].choices[0].finish_reason == 'length'
            r = post('unload_lora_adapter', lora_name='code')
            assert r.status_code == 200
            assert post('unload_lora_adapter', lora_name='code').status_code == 404
            with pytest.raises(openai.NotFoundError): ask('code')
            assert {m.id for m in client.models.list().data} == {'tiny', 'sql', 'chat'}
            # a load that did not stop the others: its slot is free again for a new one
            assert post('load_lora_adapter', lora_name='code2', lora_path=str(c)).status_code == 200
            assert ask('code2') == alone['code']
    finally: aeng.shutdown()

def test_serve_command_flags(peaky, tmp_path):
    "`nanoserve serve --enable-lora --lora-modules ...` serves them; --lora-modules without --enable-lora is refused."
    a = five_adapters(peaky, tmp_path)[0]
    with spawn_server(str(peaky), '--dtype', 'float32', '--served-model-name', 'tiny', '--enable-lora',
                      '--max-loras', '2', '--max-lora-rank', '8', '--lora-modules', f'sql={a}') as (url, _):
        client = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
        assert [m.id for m in client.models.list().data] == ['tiny', 'sql']
        assert client.completions.create(model='sql', prompt='hello', max_tokens=4).choices[0].text is not None
    r = subprocess.run([NANOSERVE, 'serve', '--model', str(peaky), '--lora-modules', f'sql={a}'], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and '--lora-modules needs --enable-lora' in r.stderr
    r = subprocess.run([NANOSERVE, 'serve', '--model', str(peaky), '--enable-lora', '--cuda-graphs'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and '--enable-lora with --cuda-graphs' in r.stderr


def test_without_the_adapter_kernel_the_layers_serve_adapter_rows(peaky, tmp_path):
    """Where the adapter kernel is not there (not built, or float16, which it does not take), adapter rows go through
    the layers' forward and the hooks' PyTorch path, never silently through the base: the same tokens as with it."""
    path = five_adapters(peaky, tmp_path)[0]
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=1)
    engine = Engine.build(peaky, dtype='float32', enable_lora=True)
    engine.load_adapter('a', path)
    want = engine.generate(PROMPTS, params, use_tqdm=False, lora='a')
    assert engine.runner.decode_call is not None
    engine.runner.decode_call.lora = None                    # the decode call as built without the adapter kernel
    engine.model.lora.kernel = None
    got = engine.generate(PROMPTS, params, use_tqdm=False, lora='a')
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    torch.testing.assert_close(torch.tensor([logprob_of(o) for o in got]), torch.tensor([logprob_of(o) for o in want]),
                               atol=1e-4, rtol=0)
    half = Engine.build(peaky, dtype='float16', enable_lora=True)
    half.load_adapter('a', path)
    one = SamplingParams(max_tokens=1, temperature=0, logprobs=5)
    for h, f in zip(half.generate(PROMPTS, one, use_tqdm=False, lora='a'),
                    engine.generate(PROMPTS, one, use_tqdm=False, lora='a')):
        assert h.token_ids == f.token_ids
        both = sorted(set(h.logprobs[0]) & set(f.logprobs[0]))
        torch.testing.assert_close(torch.tensor([h.logprobs[0][t] for t in both]),
                                   torch.tensor([f.logprobs[0][t] for t in both]), atol=0.05, rtol=0)
