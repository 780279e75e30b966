#!/usr/bin/env python
"""What a one-row decode step's 121 product calls cost beyond their bytes: the step's products (the default model's shapes, random
bfloat16 weights in the kernel's layout, each read from memory) against one product over the same number of bytes, and a sum over
them (the memory's rate), in alternating rounds. On the fifteenth pass's Zen 4 VM the 121 calls took ~2 ms more than the one call
on two threads and nothing more on one, which is where batch 1 loses most of its distance to the bandwidth ceiling there.

    python bench/product_boundaries.py                                  # 2 threads
    OMP_NUM_THREADS=1 taskset -c 1 python bench/product_boundaries.py --threads 1

Writes OUT/product_boundaries.{csv,txt} (appending) with the machine line. Not part of CI.
"""
import argparse, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import alternate, append_results
from amx_prefetch import SHAPES
from nanoserve import fast
from nanoserve.offline_bench import machine

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--rounds', type=int, default=31); p.add_argument('--threads', type=int, default=None); p.add_argument('--out', default='bench/results')
    a = p.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    if (lib := fast.amx_kernel()) is None: sys.exit("no bfloat16 product kernel on this CPU")
    g, th = torch.Generator().manual_seed(0), torch.get_num_threads()
    ws = [(k, n, fast.amx_pack(torch.randn(n, k, generator=g).bfloat16(), lib)) for k, n in SHAPES]
    nbytes = sum(k * n * 2 for k, n, _ in ws)
    NB = nbytes // (2 * 576) // 32 * 32
    big = fast.amx_pack(torch.randn(NB, 576, generator=g).bfloat16(), lib)
    flat = torch.randn(nbytes // 4)
    xs = {k: torch.randn(1, k, generator=g).bfloat16() for k in (576, 1536)}
    outs, ob = {n: torch.empty(1, n, dtype=torch.bfloat16) for _, n in SHAPES}, torch.empty(1, NB, dtype=torch.bfloat16)
    def step():
        for k, n, w in ws: lib.amx_linear(xs[k].data_ptr(), w.data_ptr(), None, outs[n].data_ptr(), 1, n, k, th, 0)
    def one(): lib.amx_linear(xs[576].data_ptr(), big.data_ptr(), None, ob.data_ptr(), 1, NB, 576, th, 0)
    med, best = alternate({'step': step, 'one': one, 'sum': lambda: flat.sum()}, a.rounds)
    row = dict(threads=th, **{f'{k}_ms': round(v, 2) for k, v in med.items()}, **{f'{k}_best_ms': round(v, 2) for k, v in best.items()},
               boundaries_ms=round(med['step'] - med['one'], 2), step_gbs=round(nbytes / med['step'] / 1e6, 1), sum_gbs=round(nbytes / med['sum'] / 1e6, 1),
               machine=machine())
    line = (f"{th} threads: 121 products {med['step']:.2f} ms, one product of the same {nbytes / 1e6:.0f} MB {med['one']:.2f} ms, a sum {med['sum']:.2f} ms "
            f"(medians of {a.rounds}); the calls' boundaries {row['boundaries_ms']:.2f} ms a step")
    print(line)
    append_results(a.out, 'product_boundaries', [row], f"machine: {machine()}", [line, 'command: python bench/product_boundaries.py ' + ' '.join(sys.argv[1:])])

if __name__ == '__main__': main()
