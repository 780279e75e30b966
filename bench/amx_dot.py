#!/usr/bin/env python
"""Day 06's AMX product kernel in three builds: the engine's (DOT_ROWS 1: one row through avx512bf16's dot products), -DDOT_ROWS=0
(the tiles at every row count: the kernel before the tenth pass) and -DDOT_ROWS=4 (dot products up to 4 rows), over the products
of one decode step of the default model's shapes (bench/amx_prefetch.py's: 30 layers and the LM head, 269 MB of random bfloat16 weights, each
read from memory), beside a sum over a float32 tensor of the same size, the memory's rate in the same rounds.

    python bench/amx_dot.py                                          # 2 threads
    OMP_NUM_THREADS=1 taskset -c 1 python bench/amx_dot.py --threads 1

Checks first that the builds agree to a bfloat16 step (they round apart: the tiles round inside a tile in their own way).
The arms alternate within every round and their order flips each round; each arm's median and fastest round per row count.
Writes OUT/amx_dot.{csv,txt} (appending) with the machine line. Not part of CI.
"""
import argparse, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import alternate, append_results
from amx_prefetch import step_weights, step_products
from nanoserve import fast
from nanoserve.core import c_library
from nanoserve.offline_bench import machine

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--rows', default='1,2,4,5'); p.add_argument('--rounds', type=int, default=12)
    p.add_argument('--threads', type=int, default=None); p.add_argument('--out', default='bench/results')
    a = p.parse_args(argv)
    if a.threads: torch.set_num_threads(a.threads)
    dots = fast.amx_kernel()
    if dots is None: sys.exit("this CPU has no AMX (or the kernel could not be built): nothing to compare")
    tiles = c_library('amx_linear_tiles_only', fast.AMX_LINEAR_C, fast.AMX_LINEAR_FLAGS + ('-DDOT_ROWS=0',), declare=fast._declare_amx)
    dots4 = c_library('amx_linear_dots_4', fast.AMX_LINEAR_C, fast.AMX_LINEAR_FLAGS + ('-DDOT_ROWS=4',), declare=fast._declare_amx)
    g = torch.Generator().manual_seed(0)
    weights = step_weights(g)
    nbytes, th = sum(w.numel() * 2 for *_, w in weights), torch.get_num_threads()
    flat = torch.randn(nbytes // 4, generator=g)                        # as many bytes as the weights, for the memory's rate
    rows_out, lines = [], []
    for m in map(int, a.rows.split(',')):
        step, outputs = step_products(weights, m, g)
        for d, t, d4 in outputs((dots, tiles, dots4)):
            for o in (d, d4): assert ((o.float() - t.float()).abs() <= t.float().abs() * 2 ** -7 + 1e-3).all(), m
        arms = {'tiles': lambda: step(tiles), 'engine': lambda: step(dots), 'dots4': lambda: step(dots4), 'sum': lambda: flat.sum()}
        med, best = alternate(arms, a.rounds)
        takes = 'dot products' if m <= dots.amx_dot_rows() else 'tiles'
        row = dict(threads=th, rows=m, engine_takes=takes, **{f'{k}_ms': round(v, 2) for k, v in med.items()},
                   **{f'{k}_best_ms': round(best[k], 2) for k in arms}, speedup=round(med['tiles'] / med['engine'], 3),
                   dots4_speedup=round(med['tiles'] / med['dots4'], 3), **{f'{k}_gbs': round(nbytes / med[k] / 1e6, 1) for k in arms}, machine=machine())
        rows_out.append(row)
        lines.append(f"{th} threads, {m} rows (engine: {takes}): tiles {med['tiles']:5.1f} ms, engine's build {med['engine']:5.1f} ms (x{row['speedup']:.2f}), "
                     f"dots up to 4 rows {med['dots4']:5.1f} ms (x{row['dots4_speedup']:.2f}); fastest {best['tiles']:.1f} / {best['engine']:.1f} / {best['dots4']:.1f}; "
                     f"a sum at {row['sum_gbs']} GB/s")
        print(lines[-1], flush=True)
    append_results(a.out, 'amx_dot', rows_out, f"machine: {machine()}; {a.rounds} rounds, arms alternating, medians; the builds checked to agree within a bfloat16 step",
                   lines + ['command: python bench/amx_dot.py ' + ' '.join(sys.argv[1:])])

if __name__ == '__main__': main()
