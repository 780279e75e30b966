#!/usr/bin/env python
"""The default model's products in bfloat16, three ways: weights read from memory as a decode step reads them.

    python bench/amx_linear.py                       # rows 1..64, 1 and 2 threads
    python bench/amx_linear.py --rows 1,32 --threads 1 --repeats 9

One "step" is the 121 products of the default model with its fused weights (30 layers of q/k/v 576->960, o 576->576, gate/up
576->3072, down 1536->576, and the LM head 576->49152), each its own weight, so nothing stays in the cache from one step to the
next: 269 MB of bfloat16 weights read per step. Arms: `F.linear` on the plain weight; `onednn`, oneDNN's packed weight
(`torch.ops.mkldnn._linear_pointwise`, Day 06's third-pass default); `amx`, Day 06's AMX kernel over its own packed copy. Beside
them, in the same rounds, the machine's read bandwidth (a 1 GiB sum), which bounds the step at 269 MB / bandwidth. The arms
alternate over --repeats rounds (this VM's memory rate drifts by half from minute to minute); each row gives an arm's fastest
and median step. Writes OUT/amx_linear.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, statistics, sys, time
from pathlib import Path
import torch
import torch.nn.functional as F
from nanoserve.offline_bench import write_csv, machine
from nanoserve.fast import amx_kernel, amx_pack, amx_product

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]          # one layer's fused products, [out, in]

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rows', default='1,2,4,8,16,32,64'); ap.add_argument('--threads', default='1,2')
    ap.add_argument('--repeats', type=int, default=7); ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    if amx_kernel() is None: raise SystemExit("this CPU has no AMX (amx_tile, amx_bf16), or the kernel could not be built: nothing to compare")
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g).bfloat16() for _ in range(30) for n, k in SHAPES] + [torch.randn(49152, 576, generator=g).bfloat16()]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    amx = [amx_pack(w) for w in weights]
    big = torch.ones(1 << 28)
    rows, mach = [], machine()
    for threads in map(int, args.threads.split(',')):
        torch.set_num_threads(threads)
        for m in map(int, args.rows.split(',')):
            onednn = [torch.ops.mkldnn._reorder_linear_weight(w, m) for w in weights]
            xs = {k: torch.randn(m, k, generator=g).bfloat16() for k in (576, 1536)}
            arms = {'F.linear': lambda: [F.linear(xs[w.shape[1]], w) for w in weights],
                    'onednn': lambda: [torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, 'none', [], '') for w, p in zip(weights, onednn)],
                    'amx': lambda: [amx_product(xs[w.shape[1]], p, None, w.shape[0]) for w, p in zip(weights, amx)],
                    'bandwidth': lambda: big.sum()}
            times = {a: [] for a in arms}
            with torch.inference_mode():
                for f in arms.values(): f()
                for _ in range(args.repeats):
                    for a, f in arms.items():
                        t0 = time.perf_counter(); f(); times[a].append(time.perf_counter() - t0)
            bw = big.numel() * 4 / min(times['bandwidth'])
            for a in ('F.linear', 'onednn', 'amx'):
                best, med = min(times[a]), statistics.median(times[a])
                rows.append(dict(threads=threads, rows=m, arm=a, step_ms_min=round(best * 1e3, 2), step_ms_median=round(med * 1e3, 2),
                                 weights_gb_s=round(nbytes / best / 1e9, 1), bandwidth_gb_s=round(bw / 1e9, 1),
                                 share_of_bandwidth=round(nbytes / best / bw, 3), machine=mach))
                print(rows[-1], file=sys.stderr, flush=True)
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out/'amx_linear.csv')
    lines = [f"machine: {mach}", f"121 products of the default model's fused shapes in bfloat16, {nbytes / 1e6:.0f} MB of weights a step; "
             f"fastest and median of {args.repeats} alternating rounds",
             f"{'threads':>7} {'rows':>4}  {'arm':<9} {'step ms (min)':>13} {'(median)':>9} {'GB/s':>6} {'sum GB/s':>9} {'share':>6}  {'x onednn':>8}"]
    for r in rows:
        base = next(x for x in rows if x['threads'] == r['threads'] and x['rows'] == r['rows'] and x['arm'] == 'onednn')
        lines.append(f"{r['threads']:>7} {r['rows']:>4}  {r['arm']:<9} {r['step_ms_min']:>13.1f} {r['step_ms_median']:>9.1f} {r['weights_gb_s']:>6.1f} "
                     f"{r['bandwidth_gb_s']:>9.1f} {r['share_of_bandwidth']:>6.0%}  {base['step_ms_min'] / r['step_ms_min']:>8.2f}")
    lines.append(f"command: python bench/amx_linear.py {' '.join(sys.argv[1:])}".rstrip())
    (out/'amx_linear.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
