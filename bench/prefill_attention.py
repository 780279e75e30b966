#!/usr/bin/env python
"""The side-by-side bench's crowd (its plan's 32 prompts at once, greedy, 64 tokens each) run in one process by the engine, with
Day 11's prefill attention (AMX's tiles, or AVX512-BF16's dot products) and with SDPA (`--no-prefill-kernel`), the arms in turn and the order flipped every round, so the
VM's drift falls on both alike. Two measurements:

- the crowd's prefill alone (every request 1 token: the 2,606 prompt tokens in 6 steps), --prefill-rounds pairs, each arm's time
  and the ratio within each pair (the arms a second apart, so the VM's drift, up to 2x within a minute, mostly cancels);
- the whole crowd, --rounds pairs: the steps that held prefill tokens (their time), the crowd's wall time and output tok/s, TTFT
  p50 and ITL p99 from each request's token times.

Writes OUT/prefill_attention.{csv,txt} with the machine line. Run it as the server runs in the side-by-side bench, on one core:

    OMP_NUM_THREADS=1 taskset -c 1 python bench/prefill_attention.py

Not part of CI.
"""
import argparse, json, statistics, sys, time
from pathlib import Path
from nanoserve.engine import EngineConfig, keep_freed_memory
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.sampling import SamplingParams
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import write_csv, machine

def pct(xs, p):
    "The p-th percentile of xs, nearest rank."
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]

def prefill_only(eng, plan) -> float:
    "The crowd's prompts with one output token each, through `eng`: seconds."
    for r in plan['requests']: eng.add_request(r['prompt'], SamplingParams(temperature=0, max_tokens=1))
    t0 = time.perf_counter()
    while eng.has_unfinished(): eng.step()
    return time.perf_counter() - t0

def crowd(eng, plan) -> dict:
    "One crowd through `eng`: its numbers, from the step loop's own clock."
    timed, orig = [], eng.runner.execute
    def execute(out):
        t = time.perf_counter(); r = orig(out)
        timed.append((any(s.num_tokens > 1 for s in out.scheduled), time.perf_counter() - t)); return r
    eng.runner.execute = execute
    try:
        for r in plan['requests']: eng.add_request(r['prompt'], SamplingParams(temperature=0, max_tokens=r['max_tokens'], ignore_eos=True))
        t0, times = time.perf_counter(), {}
        while eng.has_unfinished():
            outs = eng.step(); t = time.perf_counter()
            for o in outs: times.setdefault(o.request_id, []).append(t)
        wall = time.perf_counter() - t0
    finally: del eng.runner.execute
    itl = [b - a for v in times.values() for a, b in zip(v, v[1:])]
    return dict(wall_s=round(wall, 3), out_tok_s=round(sum(map(len, times.values())) / wall, 1),
                prefill_steps=sum(p for p, _ in timed), prefill_s=round(sum(t for p, t in timed if p), 3),
                decode_s=round(sum(t for p, t in timed if not p), 3), ttft_p50_ms=round(1e3 * statistics.median(v[0] - t0 for v in times.values()), 1),
                itl_p99_ms=round(1e3 * pct(itl, 99), 1))

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--plan', default='bench/results/archive/seventh_pass/peers_committed/plan.json')
    ap.add_argument('--rounds', type=int, default=6); ap.add_argument('--prefill-rounds', type=int, default=20)
    ap.add_argument('--out', default='bench/results')
    a = ap.parse_args()
    keep_freed_memory()
    plan = json.loads(Path(a.plan).read_text())
    eng = build_engine(resolve_model(a.model, log=lambda m: print(m, file=sys.stderr)),
                       EngineConfig(dtype='bfloat16', max_batch_size=32, prefix_cache=False), batch=PersistentBatch)
    arms = {'kernel': True, 'SDPA': False}
    rows = []
    for arm, on in arms.items(): eng.runner.prefill_kernel = on; crowd(eng, plan)           # a crowd each to warm up
    for k in range(a.prefill_rounds):
        for arm in (list(arms) if k % 2 == 0 else list(arms)[::-1]):
            eng.runner.prefill_kernel = arms[arm]
            rows.append(dict(round=k, arm=arm, run='prefill only', prefill_s=round(prefill_only(eng, plan), 3), machine=machine()))
    for k in range(a.rounds):
        for arm in (list(arms) if k % 2 == 0 else list(arms)[::-1]):
            eng.runner.prefill_kernel = arms[arm]
            rows.append(dict(round=k, arm=arm, run='crowd', **crowd(eng, plan), machine=machine()))
            print(rows[-1], file=sys.stderr, flush=True)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out/'prefill_attention.csv')
    keys = ('prefill_s', 'wall_s', 'out_tok_s', 'ttft_p50_ms', 'itl_p99_ms')
    lines = [f"machine: {machine()}", f"plan: {a.plan} ({len(plan['requests'])} requests at once), bfloat16, max batch 32, prefix cache off; "
             f"the arms in turn, the order flipped every round", '']
    pre = {(r['round'], r['arm']): r['prefill_s'] for r in rows if r['run'] == 'prefill only'}
    pairs = [pre[(k, 'SDPA')] / pre[(k, 'kernel')] for k in range(a.prefill_rounds)]
    lines += [f"the crowd's prefill alone (2,606 prompt tokens, one output token each), {a.prefill_rounds} pairs:"]
    for arm in arms:
        ts = [pre[(k, arm)] for k in range(a.prefill_rounds)]
        lines.append(f"  {arm:<11} fastest {min(ts):.3f} s, median {statistics.median(ts):.3f} s")
    lines += [f"  SDPA / kernel within each pair: median {statistics.median(pairs):.2f}x, quartiles {statistics.quantiles(pairs, n=4)[0]:.2f}-{statistics.quantiles(pairs, n=4)[2]:.2f}x, "
              f"the kernel faster in {sum(p > 1 for p in pairs)} of {len(pairs)}", '',
              f"the whole crowd, {a.rounds} pairs:", f"{'arm':<11}" + ''.join(f"{k + ' best':>17}{'median':>9}" for k in keys)]
    for arm in arms:
        got = [r for r in rows if r['arm'] == arm and r['run'] == 'crowd']
        best = lambda k: (max if k == 'out_tok_s' else min)(r[k] for r in got)
        lines.append(f"{arm:<11}" + ''.join(f"{best(k):>17g}{round(statistics.median(r[k] for r in got), 3):>9g}" for k in keys))
    cr = {(r['round'], r['arm']): r for r in rows if r['run'] == 'crowd'}
    ratio = lambda k: statistics.median(cr[(j, 'kernel')][k] / cr[(j, 'SDPA')][k] for j in range(a.rounds))
    lines += ['', f"within each pair, kernel / SDPA (medians): prefill steps {ratio('prefill_s'):.2f}x, output tok/s {ratio('out_tok_s'):.2f}x, "
              f"TTFT p50 {ratio('ttft_p50_ms'):.2f}x, ITL p99 {ratio('itl_p99_ms'):.2f}x",
              f"command: OMP_NUM_THREADS=1 taskset -c 1 python bench/prefill_attention.py --rounds {a.rounds} --prefill-rounds {a.prefill_rounds}"]
    (out/'prefill_attention.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__': main()
