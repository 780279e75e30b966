#!/usr/bin/env python
"""Day 06's float32 product kernel against oneDNN's packed product, over the products of one decode step of the default model's
shapes: 30 layers of q/k/v (576 -> 960), o (576 -> 576), gate/up (576 -> 3072) and down (1536 -> 576), then the LM head
(576 -> 49152), random float32 weights, each read from memory (540 MB in all, far past the caches).

    python bench/f32_linear.py                                  # 2 threads
    OMP_NUM_THREADS=1 taskset -c 1 python bench/f32_linear.py --threads 1
    ONEDNN_MAX_CPU_ISA=AVX2 python bench/f32_linear.py --isa avx2   # both sides on AVX2 only, on a CPU that has more

--isa picks the kernel's version (default: the one the engine runs on this CPU); ONEDNN_MAX_CPU_ISA caps oneDNN's, and the
CSV records both.

The arms alternate within every round and their order flips each round, so the VM's drift falls on both; each arm's median
and fastest round per row count. Writes OUT/f32_linear.{csv,txt} (appending a thread count's rows to the CSV) with the
machine line. Not part of CI.
"""
import argparse, os, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import alternate, append_results
from nanoserve.f32_linear import f32_kernel, f32_isa, f32_pack, f32_product
from nanoserve.offline_bench import machine

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]     # (in, out) of each product in a step

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--rows', default='1,4,8,16,32'); p.add_argument('--rounds', type=int, default=7)
    p.add_argument('--threads', type=int, default=None); p.add_argument('--out', default='bench/results')
    p.add_argument('--isa', default=None, help="the kernel's version: avx512f or avx2 (default: the engine's on this CPU)")
    a = p.parse_args(argv)
    if a.threads: torch.set_num_threads(a.threads)
    if f32_kernel() is None: sys.exit("this CPU has neither AVX-512F nor AVX2 (or the kernel could not be built): nothing to compare")
    isa, onednn_isa = a.isa or f32_isa(), os.environ.get('ONEDNN_MAX_CPU_ISA', 'default')
    g = torch.Generator().manual_seed(0)
    weights = []
    for k, n in SHAPES:
        w = torch.randn(n, k, generator=g)
        weights.append((k, n, torch.ops.mkldnn._reorder_linear_weight(w, 32), f32_pack(w)))
    th = torch.get_num_threads()
    rows_out, lines = [], []
    for m in map(int, a.rows.split(',')):
        xs = {k: torch.randn(m, k, generator=g) for k in (576, 1536)}
        arms = {'onednn': lambda: [torch.ops.mkldnn._linear_pointwise(xs[k], wp, None, 'none', [], '') for k, n, wp, _ in weights],
                'kernel': lambda: [f32_product(xs[k], pk, None, n, isa=isa) for k, n, _, pk in weights]}
        med, best = alternate(arms, a.rounds)
        row = dict(threads=th, rows=m, isa=isa, onednn_max_isa=onednn_isa, onednn_ms=round(med['onednn'], 2), kernel_ms=round(med['kernel'], 2), speedup=round(med['onednn'] / med['kernel'], 3),
                   onednn_best_ms=round(best['onednn'], 2), kernel_best_ms=round(best['kernel'], 2),
                   kernel_gflops=round(2 * m * sum(k * n for k, n in SHAPES) / med['kernel'] / 1e6, 1),
                   kernel_weights_gbs=round(4 * sum(k * n for k, n in SHAPES) / med['kernel'] / 1e6, 1), machine=machine())
        rows_out.append(row)
        lines.append(f"{th} threads, {m:2d} rows, kernel {isa}, oneDNN {onednn_isa}: oneDNN {med['onednn']:6.1f} ms, kernel {med['kernel']:6.1f} ms, x{row['speedup']:.2f} "
                     f"(fastest {best['onednn']:.1f} vs {best['kernel']:.1f}); kernel {row['kernel_gflops']} GFLOP/s, weights {row['kernel_weights_gbs']} GB/s")
        print(lines[-1], flush=True)
    append_results(a.out, 'f32_linear', rows_out, f"machine: {machine()}; {a.rounds} rounds, arms alternating, medians", lines)

if __name__ == '__main__': main()
