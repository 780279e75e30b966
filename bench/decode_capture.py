#!/usr/bin/env python
"""One decode step of the default model: eager against `compile_layers` (Day 49) and the `compile_static` and `compile` recorders (Days 54, 56), at 1, 8 and 32 rows.

    python bench/decode_capture.py [--model DIR] [--rows 1,8,32] [--context 128] [--steps 20] [--paths compile,compile_static,compile_layers]

Each compiled path runs in a fresh process of its own, beside the eager step measured again in that same process, on one K/V pool,
the two timed alternately step by step:
compiled code left behind by one path (and the allocator state it leaves) must not slow the next, and each speed-up is a ratio
measured side by side. Run it with a fresh TORCHINDUCTOR_CACHE_DIR to see cold compile times. Writes bench/results/decode_capture_56.csv (Day 49's run, one process for all paths, is bench/results/decode_capture.csv).
"""
import argparse, csv, json, statistics, subprocess, sys, time
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

def timed_pair(a, b, steps):
    "Time a and b alternately, step by step, so drift in the machine's speed reaches both alike: ((p50, p90) of a, (p50, p90) of b) in ms."
    for _ in range(3): a(); b()
    ta, tb = [], []
    for _ in range(steps):
        for fn, ts in ((a, ta), (b, tb)):
            t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return tuple((1e3 * statistics.median(ts), 1e3 * sorted(ts)[int(0.9 * (len(ts) - 1))]) for ts in (ta, tb))

def one_path(path_name, model_dir, rows_list, ctx, steps) -> list[dict]:
    "Eager and one compiled path, in this process, side by side on one pool."
    keep_freed_memory()
    model = load_model(model_dir)
    max_rows = max(rows_list)
    cache = KVCache(model.config, plan_kv_pool(model.config, max_model_len=2048, max_batch_size=max_rows, num_blocks=max_rows * (ctx // 16 + 1)), max_rows, 2048)
    torch.manual_seed(0); cache.k.normal_(); cache.v.normal_()
    for r in [Request(f'r{i}', list(range(10, 10 + ctx)), SamplingParams(), torch.Generator()) for i in range(max_rows)]: cache.allocate(r, ctx)
    tokens = [42] * max_rows
    def eager_step(m, n):
        meta = build_metadata([SeqChunk(i, i, 1, ctx) for i in range(n)], cache)
        with torch.inference_mode(): return m.compute_logits(m(torch.tensor(tokens[:n]), meta.positions, PagedAttention(cache, meta))).cpu()
    if path_name == 'compile_layers':
        fast = compile_layers(load_model(model_dir))
        step = lambda n: eager_step(fast, n)
    else:
        cap = CapturedDecode(model, cache, make_recorder(path_name), shapes=[DecodeShape(n, ctx) for n in rows_list], bucket=False)
        step = lambda n: cap.run(list(range(n)), tokens[:n], [ctx] * n)
    out = []
    for n in rows_list:
        t0 = time.perf_counter(); step(n); first = time.perf_counter() - t0
        assert torch.equal(eager_step(model, n).argmax(-1), step(n).argmax(-1)), f'{path_name} disagrees with eager at {n} rows'
        e, f = timed_pair(lambda: eager_step(model, n), lambda: step(n), steps)
        out.append(dict(rows=n, path=path_name, eager_ms=e, ms=f, first_call_s=first))
        print(out[-1], file=sys.stderr, flush=True)
    return out

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--rows', default='1,8,32')
    p.add_argument('--context', type=int, default=128); p.add_argument('--steps', type=int, default=30)
    p.add_argument('--paths', default='compile,compile_static,compile_layers')
    p.add_argument('--csv', default='bench/results/decode_capture_56.csv')
    p.add_argument('--one', default=None, help=argparse.SUPPRESS)          # internal: run one path here, print JSON
    args = p.parse_args()
    path = str(resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)))
    rows_list = [int(r) for r in args.rows.split(',')]
    if args.one:
        print(json.dumps(one_path(args.one, path, rows_list, args.context, args.steps))); return
    out = []
    for name in args.paths.split(','):
        r = subprocess.run([sys.executable, __file__, '--one', name, '--model', path, '--rows', args.rows, '--context', str(args.context),
                            '--steps', str(args.steps)], capture_output=True, text=True, check=True)
        out += json.loads(r.stdout.splitlines()[-1])
    mach = machine()
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, 'w', newline='') as f:
        w = csv.writer(f); w.writerow(['rows', 'context', 'path', 'step_ms_p50', 'step_ms_p90', 'eager_ms_p50', 'speedup', 'first_call_s', 'threads', 'machine'])
        for r in sorted(out, key=lambda r: (r['rows'], r['path'])):
            w.writerow([r['rows'], args.context, r['path'], f"{r['ms'][0]:.2f}", f"{r['ms'][1]:.2f}", f"{r['eager_ms'][0]:.2f}",
                        f"{r['eager_ms'][0] / r['ms'][0]:.3f}", f"{r['first_call_s']:.1f}", torch.get_num_threads(), mach])
    print(f"machine: {mach}; context {args.context}, float32, {torch.get_num_threads()} threads; each path in its own process beside eager")
    print(f"{'rows':>5}{'path':>16}{'p50 ms':>9}{'eager ms':>10}{'x eager':>9}{'first call s':>14}")
    for r in sorted(out, key=lambda r: (r['rows'], r['path'])):
        print(f"{r['rows']:>5}{r['path']:>16}{r['ms'][0]:>9.1f}{r['eager_ms'][0]:>10.1f}{r['eager_ms'][0] / r['ms'][0]:>9.2f}{r['first_call_s']:>14.1f}")

if __name__ == '__main__':
    main()
