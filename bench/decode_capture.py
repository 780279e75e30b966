#!/usr/bin/env python
"""One decode step of the default model, eager vs `compile_layers` (Day 49) vs the `compile` recorder (Day 54), at 1, 8 and 32 rows.

    python bench/decode_capture.py [--model DIR] [--rows 1,8,32] [--context 128] [--steps 20]

Writes bench/results/decode_capture.csv. All paths run in this one process, side by side, on the same K/V pool.
"""
import argparse, csv, os, statistics, sys, time
from pathlib import Path
import torch
from nanoserve.pull import resolve_model
from nanoserve.model import load_model
from nanoserve.kvcache import KVCache, plan_kv_pool
from nanoserve.request import Request
from nanoserve.sampling import SamplingParams
from nanoserve.attention import SeqChunk, build_metadata, PagedAttention
from nanoserve.buckets import DecodeShape
from nanoserve.capture import CapturedDecode, make_recorder
from nanoserve.compile import compile_layers
from nanoserve.engine import keep_freed_memory
from nanoserve.offline_bench import machine

def timed(fn, steps):
    for _ in range(3): fn()
    ts = []
    for _ in range(steps):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort()
    return 1e3 * statistics.median(ts), 1e3 * ts[int(0.9 * (len(ts) - 1))]

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--rows', default='1,8,32')
    p.add_argument('--context', type=int, default=128); p.add_argument('--steps', type=int, default=20)
    p.add_argument('--csv', default='bench/results/decode_capture.csv')
    args = p.parse_args()
    keep_freed_memory()
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr))
    rows_list = [int(r) for r in args.rows.split(',')]
    max_rows, ctx = max(rows_list), args.context
    model = load_model(path)
    cfg = model.config
    plan = plan_kv_pool(cfg, max_model_len=2048, max_batch_size=max_rows, num_blocks=max_rows * (ctx // 16 + 1))
    cache = KVCache(cfg, plan, max_rows, 2048)
    torch.manual_seed(0)
    cache.k.normal_(); cache.v.normal_()
    reqs = [Request(f'r{i}', list(range(10, 10 + ctx)), SamplingParams(), torch.Generator()) for i in range(max_rows)]
    for r in reqs: cache.allocate(r, ctx)          # rows 0..max_rows-1, context `ctx` each
    tokens = [42] * max_rows
    out = []
    def eager_step(m, n):
        meta = build_metadata([SeqChunk(i, i, 1, ctx) for i in range(n)], cache)
        with torch.inference_mode():
            return m.compute_logits(m(torch.tensor(tokens[:n]), meta.positions, PagedAttention(cache, meta))).cpu()
    for n in rows_list:
        out.append(dict(rows=n, path='eager', ms=timed(lambda: eager_step(model, n), args.steps), compile_s=0.0))
        print(out[-1], file=sys.stderr, flush=True)
    cap = CapturedDecode(model, cache, make_recorder('compile'), shapes=[DecodeShape(n, ctx) for n in rows_list], bucket=False)
    for n in rows_list:
        t0 = time.perf_counter(); cap.run(list(range(n)), tokens[:n], [ctx] * n); first = time.perf_counter() - t0
        ref, got = eager_step(model, n), cap.run(list(range(n)), tokens[:n], [ctx] * n)
        assert torch.equal(ref.argmax(-1), got.argmax(-1)), f'compile recorder disagrees with eager at {n} rows'
        out.append(dict(rows=n, path='compile recorder', ms=timed(lambda: cap.run(list(range(n)), tokens[:n], [ctx] * n), args.steps), compile_s=first))
        print(out[-1], file=sys.stderr, flush=True)
    model2 = compile_layers(load_model(path))
    for n in rows_list:
        t0 = time.perf_counter(); eager_step(model2, n); first = time.perf_counter() - t0
        out.append(dict(rows=n, path='compile_layers', ms=timed(lambda: eager_step(model2, n), args.steps), compile_s=first))
        print(out[-1], file=sys.stderr, flush=True)
    base = {r['rows']: r['ms'][0] for r in out if r['path'] == 'eager'}
    mach = machine()
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, 'w', newline='') as f:
        w = csv.writer(f); w.writerow(['rows', 'context', 'path', 'step_ms_p50', 'step_ms_p90', 'speedup', 'first_call_s', 'threads', 'machine'])
        for r in sorted(out, key=lambda r: (r['rows'], r['path'] != 'eager', r['path'])):
            w.writerow([r['rows'], ctx, r['path'], f"{r['ms'][0]:.2f}", f"{r['ms'][1]:.2f}", f"{base[r['rows']] / r['ms'][0]:.3f}", f"{r['compile_s']:.1f}",
                        torch.get_num_threads(), mach])
    print(f"machine: {mach}; context {ctx}, float32, {torch.get_num_threads()} threads")
    print(f"{'rows':>5}{'path':>20}{'p50 ms':>9}{'p90 ms':>9}{'x eager':>9}{'first call s':>14}")
    for r in sorted(out, key=lambda r: (r['rows'], r['path'] != 'eager', r['path'])):
        print(f"{r['rows']:>5}{r['path']:>20}{r['ms'][0]:>9.1f}{r['ms'][1]:>9.1f}{base[r['rows']] / r['ms'][0]:>9.2f}{r['compile_s']:>14.1f}")

if __name__ == '__main__':
    main()
