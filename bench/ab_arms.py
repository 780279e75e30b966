#!/usr/bin/env python
"""Arms of `bench/profile_step.py` side by side in one process, their decode steps interleaved, so that the VM's drift
(a factor of two between minutes on these machines) falls on every arm alike.

    python bench/ab_arms.py --arms onednn,amx,fast --rows 1,8,32
    OMP_NUM_THREADS=1 taskset -c 1 python bench/ab_arms.py --arms fast,fast+compile --rows 32

For each row count: one engine per arm (profile_step's arms and setup: `rows` requests with 128-token random prompts,
decoded past their prefill), then --rounds rounds in which every arm runs 4 decode steps in turn; each arm's fastest and
median round. Writes OUT/ab_arms.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_step import decoding_engine
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import write_csv, machine

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--dtype', default='bfloat16')
    ap.add_argument('--arms', default='onednn,amx,fast'); ap.add_argument('--rows', default='1,8,32')
    ap.add_argument('--rounds', type=int, default=12); ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    path, arms, out = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)), args.arms.split(','), []
    for rows in map(int, args.rows.split(',')):
        engines = {a: decoding_engine(path, args.dtype, rows, a, warm_width=512, max_tokens=100_000) for a in arms}
        times = {a: [] for a in arms}
        for _ in range(args.rounds):
            for a, eng in engines.items():
                eng.step(); t0 = time.perf_counter()
                for _ in range(4): eng.step()
                times[a].append((time.perf_counter() - t0) / 4 * 1e3)
        for a in arms:
            out.append(dict(dtype=args.dtype, rows=rows, arm=a, threads=torch.get_num_threads(), rounds=args.rounds,
                            step_ms_min=round(min(times[a]), 2), step_ms_median=round(statistics.median(times[a]), 2), machine=machine()))
            print(out[-1], file=sys.stderr, flush=True)
        for eng in engines.values(): eng.close()
        del engines
    o = Path(args.out); write_csv(out, o/'ab_arms.csv')
    lines = [f"machine: {machine()}; {args.dtype}; 128-token prompts; {args.rounds} rounds of 4 decode steps per arm, interleaved",
             f"{'rows':>4}  {'arm':<13} {'step ms (min)':>13} {'(median)':>9}  {'x ' + arms[0] + ' (min)':>14}"]
    for r in out:
        base = next(x for x in out if x['rows'] == r['rows'] and x['arm'] == arms[0])
        lines.append(f"{r['rows']:>4}  {r['arm']:<13} {r['step_ms_min']:>13.1f} {r['step_ms_median']:>9.1f}  {base['step_ms_min'] / r['step_ms_min']:>14.2f}")
    lines.append(f"command: python bench/ab_arms.py {' '.join(sys.argv[1:])}".rstrip())
    (o/'ab_arms.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
