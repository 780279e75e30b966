#!/usr/bin/env python
"""Where a prefill step's time goes: the default model's engine, four 144-token random prompts added at once (576 tokens: the first step takes
all of them with the default 4096-token budget, 512 of them with the budget before the twelfth pass), that first step timed over 5 rounds and then profiled (torch.profiler, self
CPU time by operator). With --plan, the prompts of a side-by-side plan instead (its crowd: with the default budget, all its prompt tokens
in one step); with --no-prefill-kernel, prefill attention through SDPA instead of Day 11's kernel. Writes
OUT/prefill_profile_DTYPE[_crowd][_sdpa].txt with the machine line. Not part of CI.

    python bench/prefill_profile.py --dtype float32
    OMP_NUM_THREADS=1 taskset -c 1 python bench/prefill_profile.py --dtype bfloat16 --plan bench/results/peers/plan.json
"""
import argparse, json, time
from pathlib import Path
import torch
from torch.profiler import profile, ProfilerActivity
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.sampling import SamplingParams
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import machine

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--dtype', default='float32'); p.add_argument('--out', default='bench/results')
    p.add_argument('--plan', default=None, help="a side-by-side plan.json: its prompts, not four random ones")
    p.add_argument('--no-prefill-kernel', action='store_true', help="prefill attention through SDPA")
    a = p.parse_args(argv)
    eng = build_engine(resolve_model(None), EngineConfig(dtype=a.dtype, max_batch_size=32, prefix_cache=False, prefill_kernel=not a.no_prefill_kernel),
                       batch=PersistentBatch)
    g = torch.Generator().manual_seed(0)
    plan = json.load(open(a.plan))['requests'] if a.plan else None
    def first_step(prof=None):
        prompts = [r['prompt'] for r in plan] if plan else [torch.randint(100, 40000, (144,), generator=g).tolist() for _ in range(4)]
        for prompt in prompts: eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        t = time.perf_counter()
        if prof is None: eng.step()
        else:
            with prof: eng.step()
        took = time.perf_counter() - t
        while eng.has_unfinished(): eng.step()
        return took
    for _ in range(2): first_step()
    ms = [round(1e3 * first_step()) for _ in range(5)]
    prof = profile(activities=[ProfilerActivity.CPU]); first_step(prof)
    budget, total = eng.config.max_num_batched_tokens, sum(r['prompt_len'] for r in plan) if plan else 4 * 144
    tokens = f"{min(total, budget)} of their {total} tokens, the budget being {budget}"       # the first step takes what the whole budget holds
    what = f"the first step of {a.plan}'s {len(plan)} prompts ({tokens})" if plan else f"the first step of four 144-token prompts ({tokens})"
    what += ", attention through SDPA" if a.no_prefill_kernel else ""
    flags = (f" --plan {a.plan}" if plan else "") + (" --no-prefill-kernel" if a.no_prefill_kernel else "")
    text = (f"machine: {machine()}; {a.dtype}; {what}, ms over 5 rounds: {ms}\n"
            + prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=14) + f"\nCommand: python bench/prefill_profile.py --dtype {a.dtype}{flags}\n")
    print(text)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    (out/f"prefill_profile_{a.dtype}{'_crowd' if plan else ''}{'_sdpa' if a.no_prefill_kernel else ''}.txt").write_text(text)

if __name__ == '__main__': main()
