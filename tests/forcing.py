"""Teacher forcing through an engine as it runs: the same token sequence through engines that round apart, their
logprobs compared at every position (tests/test_fast.py, tests/test_context.py, tests/test_cuda.py)."""
from dataclasses import replace
from nanoserve.sampling import SamplingParams

def forced_logprobs(engine, prompts, forced: list[list[int]], together: bool = True) -> list[list[dict]]:
    """Teacher forcing through `engine` as it runs: its scheduler, runner, kernels and decode call compute every step as
    they would, and only the token a step appends is replaced by the forced one, so engines that round apart still see
    the same sequence. Each prompt's top-5 logprobs ({token: logprob}) at each of its forced positions, the prompts run
    as one batch or (`together=False`) each alone."""
    real, by_rid = engine.runner.execute, {}
    def execute(out):
        got = real(out)
        assert not got.extra, 'teacher forcing takes no proposals'
        for i, rid in enumerate(got.req_ids):
            got.token_ids[i] = by_rid[rid][len(engine.scheduler.requests[rid].output_token_ids)]
        return got
    engine.runner.execute = execute
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=5)
    try:
        def run(batch):
            rids = [engine.add_request(prompts[i], replace(params, max_tokens=len(forced[i]))) for i in batch]
            by_rid.update(zip(rids, (forced[i] for i in batch)))
            done = {}
            while len(done) < len(rids):
                done.update((o.request_id, o) for o in engine.step() if o.finished)
            assert [done[r].token_ids for r in rids] == [forced[i] for i in batch]       # the forcing took
            return [done[r].logprobs for r in rids]
        if together: return run(range(len(prompts)))
        return [run([i])[0] for i in range(len(prompts))]
    finally: engine.runner.execute = real
