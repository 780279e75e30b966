"AsyncEngine: concurrent streams, disconnects, engine faults and shutdown, against tiny real checkpoints."
import asyncio
import pytest
from nanoserve.engine import Engine
from nanoserve.sampling import SamplingParams
from nanoserve.async_engine import AsyncEngine, EngineDeadError
from test_engine import prompts16
from conftest import break_forward_after

def params(i, n): return SamplingParams(max_tokens=n, temperature=0.8, seed=i)

async def final(aeng, p, sp):
    last = None
    async for o in aeng.generate(p, sp): last = o
    return last

def consumer(aeng, sp):
    "A task streaming one request for 'hello', and an event set once its first output arrives."
    first = asyncio.Event()
    async def consume():
        async for o in aeng.generate('hello', sp): first.set()
    return asyncio.create_task(consume()), first

async def settle(aeng, timeout=60.0):
    "Wait (on the loop's own condition) until the engine thread has applied every command and ended every request."
    assert await asyncio.to_thread(aeng.wait_idle, timeout), 'engine did not settle'


def test_32_concurrent_streams_match_offline(tiny):
    path = tiny('llama_tied_gqa')
    ps = (prompts16(320, seed=1) * 2)[:32]
    sps = [params(i, 4 + (i * 7) % 20) for i in range(32)]
    want = Engine.build(path, dtype='float32').generate(ps, sps, use_tqdm=False)
    aeng = AsyncEngine(Engine.build(path, max_batch_size=8, check_invariants=True, dtype='float32'))
    async def main():
        outs = await asyncio.gather(*(final(aeng, p, sp) for p, sp in zip(ps, sps)))
        await settle(aeng)
        return outs
    try:
        outs = asyncio.run(main())
        assert [o.token_ids for o in outs] == [w.token_ids for w in want]
        assert [o.text for o in outs] == [w.text for w in want]
        s = aeng.stats()
        assert (s.num_finished, s.num_running, s.kv_free_blocks) == (32, 0, s.kv_total_blocks)
    finally: aeng.shutdown()

def test_disconnects_free_everything(tiny):
    aeng = AsyncEngine(Engine.build(tiny('llama_untied_mha'), max_batch_size=8, check_invariants=True, dtype='float32'))
    async def leave(i):
        async for o in aeng.generate(prompts16(320)[i % 16], params(i, 500 if i < 200 else 5)):
            if len(o.token_ids) >= 2 + i % 3: break
    async def main():
        await asyncio.gather(*(leave(i) for i in range(20)))
        await settle(aeng)
    try:
        asyncio.run(main())
        s = aeng.stats()
        assert (s.num_aborted, s.num_running, s.num_waiting, s.kv_free_blocks) == (20, 0, 0, s.kv_total_blocks)
    finally: aeng.shutdown()

def test_cancelled_task_aborts_its_request(tiny):
    aeng = AsyncEngine(Engine.build(tiny('llama_tied_gqa'), dtype='float32'))
    async def main():
        task, started = consumer(aeng, params(1, 400))
        await started.wait(); task.cancel()
        with pytest.raises(asyncio.CancelledError): await task
        await settle(aeng)
    try:
        asyncio.run(main())
        assert aeng.stats().num_aborted == 1 and aeng.engine.cache.pool.num_free == aeng.engine.plan.num_blocks
    finally: aeng.shutdown()

def test_engine_fault_fails_in_flight_requests_and_marks_dead(tiny):
    aeng = AsyncEngine(Engine.build(tiny('llama_tied_gqa'), max_batch_size=4, dtype='float32'))
    break_forward_after(aeng.engine, 3, once_holding=6)      # all six in the engine (4 running, 2 waiting) before it fails
    async def main():
        return await asyncio.wait_for(asyncio.gather(*(final(aeng, p, params(i, 50)) for i, p in enumerate(prompts16(320)[:6])),
                                                     return_exceptions=True), timeout=30)
    try:
        res = asyncio.run(main())
        assert all(isinstance(r, EngineDeadError) and 'injected fault in the forward' in str(r) for r in res)
        assert not aeng.running and not aeng.stats().alive
        with pytest.raises(EngineDeadError, match='not running'): asyncio.run(final(aeng, 'hi', params(0, 3)))
    finally: aeng.shutdown()

def test_shutdown_ends_open_streams_and_frees_blocks(tiny):
    aeng = AsyncEngine(Engine.build(tiny('llama_tied_gqa'), dtype='float32'))
    async def main():
        task, got = consumer(aeng, params(2, 400))
        await got.wait()
        await asyncio.get_running_loop().run_in_executor(None, aeng.shutdown)
        with pytest.raises(EngineDeadError, match='shut down'): await asyncio.wait_for(task, 10)
    asyncio.run(main())
    assert not aeng.engine.serving_thread.is_alive() and aeng.engine.cache.pool.num_free == aeng.engine.plan.num_blocks

def test_bad_input_refused_before_the_engine_sees_it(tiny):
    from nanoserve.core import RequestError
    aeng = AsyncEngine(Engine.build(tiny('llama_tied_gqa'), max_model_len=64, dtype='float32'))
    try:
        with pytest.raises(RequestError, match='max_model_len is 64'): asyncio.run(final(aeng, [5] * 64, params(0, 3)))
        assert aeng.stats().num_requests == 0 and aeng.running
    finally: aeng.shutdown()
