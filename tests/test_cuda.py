"""The engine on a CUDA device (`pytest -m cuda`; skipped where torch sees none): eager and recorded decodes, the
persistent batch, the prefix cache, structured output, seeded sampling and a real server, every step under the device
discipline. bench/gpu/run.sh runs these first on the lent GPU machine; no CPU session can."""
import asyncio
import httpx, openai, pytest, torch
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.loadgen import spawn_server
from test_device_discipline import PROMPTS, mixed_params

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]
CUDA = dict(device='cuda', max_batch_size=4, max_model_len=256, check_devices=True)
GRAPHS = dict(bucket_decode=True, persist_inputs=True, capture_decode=True, capture_recorder='cuda_graph')

def run(path, **flags):
    engine = build_engine(str(path), EngineConfig(**CUDA | flags), batch=PersistentBatch)
    outs = engine.generate(PROMPTS * 2, mixed_params() * 2, use_tqdm=False)
    return engine, [o.token_ids for o in outs]

@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_eager_on_cuda(peaky, dtype):
    "Every sampling path, the prefix cache and a grammar, eager on the card: the first GPU run died at a decode."
    engine, toks = run(peaky, dtype=dtype)
    assert str(engine.model.device).startswith('cuda') and engine.cache.k.is_cuda
    assert len(toks[0]) == 12 and all(toks)
    assert engine.snapshot().prefix_cache_hits > 0 and engine.snapshot().num_device_checks > 0

def test_recorded_decode_equals_eager_on_cuda(peaky):
    "CUDA graphs over the persistent batch give the eager tokens (float32, logits far apart); every decode replays."
    _, eager = run(peaky, dtype='float32')
    engine, graphs = run(peaky, dtype='float32', **GRAPHS)
    assert graphs == eager
    stats = engine.decode_path.stats
    assert stats.replays > 0 and stats.replay_share == 1.0, stats

def test_server_on_cuda(peaky):
    "A real server on the card with the capture, under the check: seeded and JSON requests from the openai client."
    flags = ('--device', 'cuda', '--cuda-graphs', '--check-devices', '--max-model-len', '256', '--max-batch-size', '4',
             '--served-model-name', 'tiny')
    with spawn_server(peaky, *flags) as (url, _):
        async def crowd():
            client = openai.AsyncOpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
            async def one(i):
                body = dict(model='tiny', prompt=PROMPTS[i % 3], max_tokens=12, temperature=0.8, seed=i)
                if i % 3 == 2: body['extra_body'] = {'response_format': {'type': 'json_object'}}
                return (await client.completions.create(**body)).choices[0].finish_reason
            return await asyncio.gather(*map(one, range(8)))
        finished = asyncio.run(crowd())
        health = httpx.get(url + '/health').json()
    assert all(f in ('length', 'stop') for f in finished), finished
    assert health['device'].startswith('cuda') and health['stats']['num_device_checks'] > 0
    assert health['cuda_graphs']['runtime']['replays'] > 0

def test_the_heads_logits_are_float32_sums_on_the_card():
    """A bfloat16 head on the card writes float32 sums (`wide_linear`: cuBLAS's float32 output where torch has it, else the
    weight widened), within float32's error of float64, far inside bfloat16's step."""
    from nanoserve.model import wide_linear, mm_writes_float32
    g = torch.Generator(device='cuda').manual_seed(0)
    x = torch.randn(4, 576, device='cuda', generator=g).bfloat16()
    w = torch.randn(1000, 576, device='cuda', generator=g).bfloat16()
    y, exact = wide_linear(x, w), x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    print(f"the card's float32-output product: {'used' if mm_writes_float32(x.device) else 'absent: widened'}")
    assert y.dtype == torch.float32 and ((y.double() - exact).abs() <= scale * 2 ** -16).all()
    assert (y != y.bfloat16().float()).float().mean() > 0.9

def test_float32_on_the_card_equals_the_cpu_at_every_position(peaky):
    """A 400-token prompt's last 16 positions, teacher-forced, in float32 on the card and on the CPU (each with its own
    attention and products): the same top logprobs to float32's rounding."""
    from nanoserve.engine import Engine
    from forcing import forced_logprobs
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (400,), generator=g).tolist()
    cpu = Engine.build(str(peaky), dtype='float32', max_model_len=512)
    card = build_engine(str(peaky), EngineConfig(**CUDA | dict(dtype='float32', max_model_len=512)), batch=PersistentBatch)
    a, b = (forced_logprobs(e, [ids[:-16]], [ids[-16:]])[0] for e in (cpu, card))
    assert len(a) == len(b) == 16
    assert max(abs(x[t] - y[t]) for x, y in zip(a, b) for t in x.keys() & y.keys()) < 1e-3

def test_the_triton_kernels_match_their_references_on_the_card():
    """Each Triton kernel compiled for the card against its reference (the interpreter checked the same on the CPU), and
    a token's attention the same bits alone, in a crowd and inside a prefill chunk: the card's MMA order per row."""
    from nanoserve import triton_kernels as card
    g = torch.Generator(device='cuda').manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        kc, vc = (torch.randn(4096, 8, 128, device='cuda', generator=g).to(dtype) for _ in range(2))
        table = torch.randperm(4096, device='cuda', generator=g)[:4 * 1024].view(4, 1024).to(torch.int32)
        pos = torch.tensor([9, 700, 1023] + list(range(300, 340)), device='cuda')
        rows = torch.tensor([0, 1, 2] + [3] * 40, device='cuda')
        q = torch.randn(len(pos), 16, 128, device='cuda', generator=g).to(dtype)
        tiles = card.attention_tiles([(0, 1, 0), (1, 1, 1), (2, 1, 2), (3, 40, 3)], 16, 8, 128, 'cuda')
        got = card.paged_attention(q, kc, vc, table, tiles, pos, 1024)
        ref = card.paged_attention_reference(q, kc, vc, table, rows, pos)
        assert (got.float() - ref.float()).abs().max() < tol, dtype
        for t in (0, 1, 20):
            alone = card.paged_attention(q[t:t + 1], kc, vc, table, card.attention_tiles([(0, 1, int(rows[t]))], 16, 8,
                                         128, 'cuda'), pos[t:t + 1], int(pos[t]) + 1)
            assert torch.equal(alone, got[t:t + 1]), (dtype, t)
        x, w = torch.randn(33, 1024, device='cuda', generator=g).to(dtype), torch.randn(3072, 1024, device='cuda',
                                                                                      generator=g).to(dtype)
        y = card.fixed_linear(x, w)
        assert ((y.double() - x.double() @ w.double().T).abs() <= (x.double().abs() @ w.double().abs().T) * 2 ** -7).all()
        assert all(torch.equal(card.fixed_linear(x[:n], w), y[:n]) for n in (1, 7, 32))

def test_the_card_is_batch_invariant_by_default_and_reads_back_once(peaky):
    """bfloat16 on the card: the batch-invariant mode on by default through the fixed-order kernels; a seeded request's
    tokens and logprobs the same bits alone and in a crowd; every step reads the card once (`HostSyncs`)."""
    from nanoserve.core import HostSyncs
    from nanoserve.sampling import SamplingParams
    engine = build_engine(str(peaky), EngineConfig(**CUDA | dict(dtype='bfloat16')), batch=PersistentBatch)
    assert engine.runner.invariance['how'] == 'fixed-order kernels', engine.runner.invariance
    seeded = SamplingParams(max_tokens=8, temperature=0.9, seed=7, logprobs=3, ignore_eos=True)
    alone = engine.generate([PROMPTS[0]], [seeded], use_tqdm=False)[0]
    crowd = engine.generate(PROMPTS + [PROMPTS[0]], mixed_params()[:3] + [seeded], use_tqdm=False)[-1]
    assert (alone.token_ids, alone.logprobs) == (crowd.token_ids, crowd.logprobs)
    for i, p in enumerate(PROMPTS[:2]): engine.add_request(p, seeded, request_id=f's{i}')
    while engine.has_unfinished():
        with HostSyncs() as check: outs = engine.step()
        assert check.syncs == {} and check.read_backs == int(bool(outs)), check.syncs
