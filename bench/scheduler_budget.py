#!/usr/bin/env python
"""The scheduler's two token budgets (Day 16), measured on the side-by-side crowd in one process: one engine, the budgets
switched between runs, arms in turn and their order flipped every round, so the VM's drift falls on every arm alike.

    OMP_NUM_THREADS=1 taskset -c 1 python bench/scheduler_budget.py --arms 512/512,512/256,256/256,512/192 --rounds 5

An arm is WHOLE/MIXED: `max_num_batched_tokens` / `max_mixed_batched_tokens`. Every run adds the plan's 32 requests at once
(greedy, ignore_eos) and steps the engine until they end; prefix caching is off, so every run computes every prompt. The
engine's clock gives each request's token times (a step's end), hence ITL p99 and TTFT p50 as a client on the same core would
see them, without the HTTP front end. Writes OUT/scheduler_budget.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, csv, json, statistics, sys, time
from pathlib import Path
import torch
from nanoserve.engine import EngineConfig, keep_freed_memory
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.sampling import SamplingParams
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import machine

HERE = Path(__file__).resolve().parent

def run(eng, plan: dict, whole: int, mixed: int) -> dict:
    "One crowd at these budgets: wall time, ITL p99, TTFT p50 (ms), steps."
    eng.scheduler.max_num_batched_tokens, eng.scheduler.max_mixed_batched_tokens = whole, min(mixed, whole)
    ids = [eng.add_request(r['prompt'], SamplingParams(temperature=0, max_tokens=r['max_tokens'], ignore_eos=True)) for r in plan['requests']]
    reqs = {i: eng.scheduler.requests[i] for i in ids}
    times = {i: [] for i in ids}
    t0, steps = time.perf_counter(), 0
    while eng.has_unfinished():
        eng.step(); now = time.perf_counter(); steps += 1
        for i, r in reqs.items():
            if len(r.output_token_ids) > len(times[i]): times[i].append(now)
    wall = time.perf_counter() - t0
    itl = sorted(b - a for ts in times.values() for a, b in zip(ts, ts[1:]))
    ttft = sorted(ts[0] - t0 for ts in times.values())
    out = sum(len(ts) for ts in times.values())
    return dict(wall_s=wall, out_tok_s=out / wall, itl_p99_ms=1e3 * itl[int(0.99 * len(itl))], ttft_p50_ms=1e3 * ttft[len(ttft) // 2], steps=steps)

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--arms', default='512/512,512/256,256/256,512/192')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--plan', default=str(HERE/'results'/'peers'/'plan.json'))
    p.add_argument('--out', default=str(HERE/'results'/'seventh_pass'))
    a = p.parse_args(argv)
    keep_freed_memory()
    arms = [tuple(int(x) for x in s.split('/')) for s in a.arms.split(',')]
    plan = json.load(open(a.plan))
    eng = build_engine(resolve_model(None), EngineConfig(dtype='bfloat16', max_batch_size=32, prefix_cache=False), batch=PersistentBatch)
    run(eng, plan, *arms[0])                                    # warm-up, not counted
    rows = []
    for k in range(a.rounds):
        for whole, mixed in (arms if k % 2 == 0 else arms[::-1]):
            r = dict(round=k, whole=whole, mixed=mixed, **run(eng, plan, whole, mixed), machine=machine()); rows.append(r)
            print(f"round {k} {whole}/{mixed}: {r['out_tok_s']:.0f} tok/s, ITL p99 {r['itl_p99_ms']:.0f} ms, TTFT p50 {r['ttft_p50_ms']:.0f} ms, {r['steps']} steps", flush=True)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    with open(out/'scheduler_budget.csv', 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
    lines = [f"machine: {machine()}",
             f"plan: {Path(a.plan).resolve().relative_to(HERE.parent) if Path(a.plan).resolve().is_relative_to(HERE.parent) else a.plan} ({len(plan['requests'])} requests at once), bfloat16, max batch 32, prefix cache off; {a.rounds} rounds, arms in turn, order flipped every round",
             '', f"{'whole/mixed':>12} {'out tok/s median (best)':>24} {'ITL p99 ms':>11} {'TTFT p50 ms':>12} {'steps':>6}"]
    for whole, mixed in arms:
        rs = [r for r in rows if (r['whole'], r['mixed']) == (whole, mixed)]
        med = lambda key: statistics.median(r[key] for r in rs)
        arm, speed = f'{whole}/{mixed}', f"{med('out_tok_s'):.0f} ({max(r['out_tok_s'] for r in rs):.0f})"
        lines.append(f"{arm:>12} {speed:>24} {med('itl_p99_ms'):>11.0f} {med('ttft_p50_ms'):>12.0f} {rs[0]['steps']:>6}")
    (out/'scheduler_budget.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': sys.exit(main())
