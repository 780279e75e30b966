#!/usr/bin/env python
"""Day 06's AMX product kernel with its prefetch (AHEAD bytes, the engine's build) against the same kernel built with -DAHEAD=0
(no prefetch: the kernel before the ninth pass), both built with -DDOT_ROWS=0 so that every row count takes the tiles (since the
tenth pass the engine's build takes dot products for up to 4 rows: bench/amx_dot.py), over the products of one decode step of
the default model's shapes (30 layers of q/k/v, o, gate/up and down, then the LM head), random bfloat16 weights, each read from
memory (269 MB in all).

    python bench/amx_prefetch.py                                     # 2 threads
    OMP_NUM_THREADS=1 taskset -c 1 python bench/amx_prefetch.py --threads 1

Checks first that both builds give the same bits. The arms alternate within every round and their order flips each round;
each arm's median and fastest round per row count. Writes OUT/amx_prefetch.{csv,txt} (appending) with the machine line. Not part of CI.
"""
import argparse, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import alternate, append_results
from nanoserve import fast
from nanoserve.core import c_library
from nanoserve.offline_bench import machine

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]     # (in, out) of each product in a step

def step_weights(g) -> list:
    "(in, out, packed weight) of each product in a step, random bfloat16 weights in the AMX kernel's layout."
    return [(k, n, fast.amx_pack(torch.randn(n, k, generator=g).bfloat16())) for k, n in SHAPES]

def step_products(weights: list, m: int, g):
    """`step(lib)`: every product of a decode step of m rows through `lib.amx_linear`; `outputs(libs)`: for a layer's four products
    and the LM head, each lib's result (a list per product), to compare the builds' bits or rounding."""
    th = torch.get_num_threads()
    xs = {k: torch.randn(m, k, generator=g).bfloat16() for k in (576, 1536)}
    outs = {n: torch.empty(m, n, dtype=torch.bfloat16) for n in {n for _, n in SHAPES}}
    def step(lib):
        for k, n, w in weights: lib.amx_linear(xs[k].data_ptr(), w.data_ptr(), None, outs[n].data_ptr(), m, n, k, th, 0)
    def outputs(libs):
        for k, n, w in weights[:4] + weights[-1:]:
            got = [torch.empty(m, n, dtype=torch.bfloat16) for _ in libs]
            for lib, o in zip(libs, got): lib.amx_linear(xs[k].data_ptr(), w.data_ptr(), None, o.data_ptr(), m, n, k, th, 0)
            yield got
    return step, outputs

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--rows', default='1,4,8,16,24,32'); p.add_argument('--rounds', type=int, default=8)
    p.add_argument('--threads', type=int, default=None); p.add_argument('--out', default='bench/results')
    a = p.parse_args(argv)
    if a.threads: torch.set_num_threads(a.threads)
    if fast.amx_kernel() is None: sys.exit("this CPU has no AMX (or the kernel could not be built): nothing to compare")
    new = c_library('amx_linear_tiles_only', fast.AMX_LINEAR_C, fast.AMX_LINEAR_FLAGS + ('-DDOT_ROWS=0',), declare=fast._declare_amx)
    old = c_library('amx_linear_tiles_no_prefetch', fast.AMX_LINEAR_C, fast.AMX_LINEAR_FLAGS + ('-DAHEAD=0', '-DDOT_ROWS=0'), declare=fast._declare_amx)
    g = torch.Generator().manual_seed(0)
    weights = step_weights(g)
    nbytes, th = sum(w.numel() * 2 for *_, w in weights), torch.get_num_threads()
    rows_out, lines = [], []
    for m in map(int, a.rows.split(',')):
        step, outputs = step_products(weights, m, g)
        for got in outputs((old, new)): assert torch.equal(*got)            # the same bits from both builds
        arms = {'no_prefetch': lambda: step(old), 'prefetch': lambda: step(new)}
        med, best = alternate(arms, a.rounds)
        row = dict(threads=th, rows=m, no_prefetch_ms=round(med['no_prefetch'], 2), prefetch_ms=round(med['prefetch'], 2),
                   speedup=round(med['no_prefetch'] / med['prefetch'], 3), no_prefetch_best_ms=round(best['no_prefetch'], 2),
                   prefetch_best_ms=round(best['prefetch'], 2), prefetch_weights_gbs=round(nbytes / med['prefetch'] / 1e6, 1), machine=machine())
        rows_out.append(row)
        lines.append(f"{th} threads, {m:2d} rows: no prefetch {med['no_prefetch']:6.1f} ms, prefetch {med['prefetch']:6.1f} ms, x{row['speedup']:.2f} "
                     f"(fastest {best['no_prefetch']:.1f} vs {best['prefetch']:.1f}); weights {row['prefetch_weights_gbs']} GB/s with the prefetch")
        print(lines[-1], flush=True)
    append_results(a.out, 'amx_prefetch', rows_out, f"machine: {machine()}; {a.rounds} rounds, arms alternating, medians; bits checked equal",
                   lines + ['command: python bench/amx_prefetch.py ' + ' '.join(sys.argv[1:])])

if __name__ == '__main__': main()
