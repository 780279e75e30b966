"""Device discipline (Day 00's `DeviceDiscipline`, `--check-devices`): every path of a step run with the check on, so a
tensor made without naming its device (on a GPU it lands on the host, and the step dies where it meets the engine's
tensors) fails here, on the CPU. Each case shows that its path ran (replays, prefix hits, preemptions, a grammar's
mask) and that the check saw the step's factories, so a pass is not a check that looked at nothing."""
import asyncio
import torch
import httpx, openai, pytest
from nanoserve.engine import Engine, EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.quant import quantize_model
from nanoserve.sampling import SamplingParams
from nanoserve.grammar import Structured
from nanoserve.loadgen import spawn_server

CAPTURE = dict(bucket_decode=True, persist_inputs=True, capture_decode=True, warm_rows=4, max_model_len=256,
               capture_recorder='compile')
PATHS = {                        # name -> engine flags: every product, attention and decode path of a CPU step
    'default': {},
    'no_batch_invariant': dict(batch_invariant=False),
    'float32': dict(dtype='float32'),
    # SDPA over the gathered window: the path the card crashed on
    'pytorch_only': dict(decode_kernel=False, decode_call=False, prefill_kernel=False, small_ops=False,
                         amx_linear=False, batch_invariant=False),
    'invariant_blocked_attention': dict(decode_kernel=False, batch_invariant=True),
    'int8': dict(quantization='int8'),
    'capture_persistent_batch': CAPTURE,
    'capture_scattered_rows': CAPTURE | dict(persistent_batch=False),
    # the CPU's default recorder where the model takes the decode call: the call itself, over any rows
    'capture_decode_call': CAPTURE | dict(capture_recorder=None, persistent_batch=False),
    'tight_pool': dict(num_kv_blocks=12, max_model_len=128),
}
PROMPTS = ['hello world ' * 30 + 'hello', 'hello world ' * 30 + 'world', 'world']     # two share 3 blocks: prefix hits

def mixed_params() -> list[SamplingParams]:
    "Seeded sampling with every penalty and a logit bias, greedy with min_tokens and a stop id, and a JSON grammar."
    return [SamplingParams(max_tokens=12, temperature=0.8, seed=1, repetition_penalty=1.2, presence_penalty=0.5,
                           frequency_penalty=0.3, logit_bias=((5, 2.0),), logprobs=2, ignore_eos=True),
            SamplingParams(max_tokens=10, temperature=0, min_tokens=3, top_k=5, stop_token_ids=(7,)),
            SamplingParams(max_tokens=20, temperature=0.7, seed=2, top_p=0.9, min_p=0.05,
                           structured=Structured.json_schema({'type': 'object'}))]

@pytest.mark.parametrize('name', list(PATHS))
def test_every_step_names_its_devices(tiny, name):
    "The engine's steps (and the capture's warm-up) under the check: nothing refused, and each case's path seen to run."
    cfg = EngineConfig(max_batch_size=4, check_devices=True, **PATHS[name])
    # head size 16 for the decode call's recorder (its attention kernel has no version for llama_tied_gqa's 8)
    kind = 'llama_untied_mha' if name == 'capture_decode_call' else 'llama_tied_gqa'
    engine = build_engine(str(tiny(kind)), cfg, batch=PersistentBatch, quantize=quantize_model)
    warmed = engine.num_device_checks
    outs = engine.generate(PROMPTS * 2, mixed_params() * 2, use_tqdm=False)
    assert [len(o.token_ids) for o in outs][:1] == [12] and all(o.finished for o in outs)
    snap = engine.snapshot()
    # the decode call's recordings run nothing at boot: there is no warm-up to check
    warms = cfg.capture_decode and engine.boot.recorder != 'decode_call'
    assert snap.num_device_checks > warmed > 0 if warms else snap.num_device_checks > warmed
    assert snap.prefix_cache_hits > 0
    if name == 'tight_pool': assert snap.num_preemptions > 0
    if cfg.capture_decode:
        stats = engine.decode_path.stats
        assert stats.replays > 0
        if name == 'capture_scattered_rows': assert stats.scattered_calls > 0
        if name == 'capture_decode_call':
            assert engine.boot.recorder == 'decode_call' and stats.replays == stats.decode_steps
    assert engine.runner.grammars is not None                       # the grammar's mask was built under the check

def test_tensor_parallel_ranks_step_under_the_check(tiny):
    """Rank 0 and the worker both run their steps under the check (the worker takes it from rank 0's setup); a refusal
    there would end the step."""
    engine = Engine.build(str(tiny('llama_tied_gqa')), max_batch_size=4, tensor_parallel_size=2, check_devices=True)
    try:
        outs = engine.generate(PROMPTS, mixed_params(), use_tqdm=False)
        assert all(o.finished for o in outs) and engine.snapshot().num_device_checks > 0
        assert engine.runner.fault is None
    finally: engine.runner.close()

def test_server_under_the_check(tiny):
    """`nanoserve serve --check-devices --cuda-graphs`: the warm-up and every step of a crowd of seeded, streamed and
    JSON-constrained requests from the openai client under the check; /health counts what it saw and the replays that
    served the decodes."""
    flags = ('--check-devices', '--cuda-graphs', '--warm-rows', '4', '--max-model-len', '256', '--max-batch-size', '4',
             '--served-model-name', 'tiny')
    with spawn_server(tiny('llama_tied_gqa'), *flags) as (url, _):
        async def crowd():
            client = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
            async def one(i):
                if i % 3 == 2:
                    r = await client.completions.create(model='tiny', prompt=PROMPTS[i % 3], max_tokens=12,
                                                        temperature=0.7, seed=i,
                                                        extra_body={'response_format': {'type': 'json_object'}})
                    return r.choices[0].finish_reason
                stream = await client.completions.create(model='tiny', prompt=PROMPTS[i % 3], max_tokens=12,
                                                         temperature=0.8, seed=i, stream=True, presence_penalty=0.5,
                                                         logit_bias={'5': 3})
                return [c.choices[0].finish_reason async for c in stream if c.choices][-1]
            return await asyncio.gather(*map(one, range(6)))
        finished = asyncio.run(crowd())
        health = httpx.get(url + '/health').json()
    assert all(f in ('length', 'stop') for f in finished), finished
    assert health['status'] == 'ok' and health['stats']['num_device_checks'] > 0
    assert health['cuda_graphs']['runtime']['replays'] > 0

@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_c_kernels_never_take_a_tensor_off_the_host(dtype):
    """The CPU's C kernels read raw pointers: given tensors that are not in host memory (on PyTorch's `meta` device,
    which holds no memory at all, standing in for a card's) every entry declines (None) before it touches one."""
    from nanoserve.elementwise import rms_norm, silu_mul, rope_
    from nanoserve.attention import kernel_attention, token_attention
    from nanoserve.prefill_kernel import kernel_prefill_attention
    from nanoserve.fast import amx_pack
    from nanoserve.f32_linear import f32_pack
    m = dict(device='meta', dtype=dtype)
    x, w = torch.empty(4, 64, **m), torch.empty(64, **m)
    assert rms_norm(x, w, 1e-5) is None and silu_mul(torch.empty(4, 128, **m)) is None
    pos, cos = torch.zeros(4, dtype=torch.int64, device='meta'), torch.empty(16, 8, device='meta')
    assert rope_(torch.empty(4, 2, 16, **m), pos, cos, cos) is None
    q, pool = torch.empty(2, 4, 64, **m), torch.empty(32, 2, 64, **m)
    slots = torch.zeros(16, dtype=torch.int64, device='meta')
    assert kernel_attention(q, pool, pool, slots, torch.ones(2, dtype=torch.int64, device='meta')) is None
    assert token_attention(q, pool, pool, slots, torch.ones(2, dtype=torch.int64, device='meta')) is None
    assert kernel_prefill_attention(q, pool, pool, slots) is None
    assert amx_pack(torch.empty(64, 64, **m)) is None and f32_pack(torch.empty(64, 64, **m)) is None

def test_the_same_calls_run_on_the_host():
    "The control for the test above: the same shapes in host memory (float32, which every x86 kernel takes) run."
    from nanoserve.elementwise import rms_norm, silu_mul
    from nanoserve.attention import kernel_attention
    from nanoserve.f32_linear import f32_pack
    x, w = torch.randn(4, 64), torch.ones(64)
    assert rms_norm(x, w, 1e-5) is not None and silu_mul(torch.randn(4, 128)) is not None
    q, pool = torch.randn(2, 4, 64), torch.randn(32, 2, 64)
    slots = torch.arange(16, dtype=torch.int64).repeat(2)
    assert kernel_attention(q, pool, pool, slots, torch.full((2,), 16, dtype=torch.int64)) is not None
    assert f32_pack(torch.randn(64, 64)) is not None

def test_the_cards_sampler_runs_the_engine(tiny):
    """The sampler a card takes (Day 14's `sample_on_device`), given a CPU engine's logits under the check: greedy
    requests get the host sampler's tokens, seeded ones the same tokens alone and in a crowd, a grammar's request
    parses, logprobs come back."""
    path = str(tiny('llama_untied_mha'))                # head size 16: the decode kernel takes it, so the mode runs
    def engine(on_device, **kw):
        cfg = EngineConfig(max_batch_size=4, check_devices=True, dtype='float32', **kw)
        e = build_engine(path, cfg, batch=PersistentBatch)
        e.runner.sample_on_device = on_device
        return e
    greedy = [SamplingParams(max_tokens=10, temperature=0, repetition_penalty=1.3, logit_bias=((5, 1.5),),
                             ignore_eos=True)] * 3
    test = engine(True).generate(PROMPTS, greedy, use_tqdm=False)
    assert [o.token_ids for o in test] == [o.token_ids for o in engine(False).generate(PROMPTS, greedy, use_tqdm=False)]
    seeded = [SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=40 + i, logprobs=2, ignore_eos=True)
              for i in range(3)]
    recorded = engine(True, **CAPTURE)                   # the recorded decode, whose logits a card keeps on the card
    assert recorded.runner.batch_invariant
    crowd = recorded.generate(PROMPTS, seeded, use_tqdm=False)
    alone = [recorded.generate([p], [s], use_tqdm=False)[0] for p, s in zip(PROMPTS, seeded)]
    assert recorded.decode_path.stats.replays > 0
    assert [(o.token_ids, o.logprobs) for o in crowd] == [(o.token_ids, o.logprobs) for o in alone]
    assert all(len(o.logprobs) == 12 for o in crowd)
    json_params = SamplingParams(max_tokens=40, temperature=0.8, seed=3,
                                 structured=Structured.json_schema({'type': 'object'}))
    js = engine(True).generate(['world'], [json_params], use_tqdm=False)[0]
    assert js.token_ids and js.text.lstrip().startswith('{')
