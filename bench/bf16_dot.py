#!/usr/bin/env python
"""Day 06's bfloat16 product kernel built without tiles (-DNO_TILES: avx512bf16's dot products at every row count, the build a CPU
with AVX512-BF16 and no AMX takes) against oneDNN's packed bfloat16 product (the engine's product without the kernel, and with
--no-amx-linear), and against the float32 kernel over float32 copies of the same weights (twice the bytes), over the
products of one decode step of the default model's shapes (bench/amx_prefetch.py's: 30 layers and the LM head, 269 MB of random
bfloat16 weights, each read from memory), beside a sum over a float32 tensor of the same size, the memory's rate in the same rounds.
On a CPU with AMX the engine's AMX build is one more arm. Each build multiplies
the copy its own `amx_pack` wrote.

    python bench/bf16_dot.py                                         # 2 threads
    OMP_NUM_THREADS=1 taskset -c 1 python bench/bf16_dot.py --threads 1

Checks first that the dot products agree with oneDNN's to a bfloat16 step. The arms alternate within every round and their order
flips each round; each arm's median and fastest round per row count. Writes OUT/bf16_dot.{csv,txt} (appending) with the machine
line. Not part of CI.
"""
import argparse, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import alternate, append_results
from amx_prefetch import SHAPES
from nanoserve import fast
from nanoserve.core import c_library
from nanoserve.f32_linear import f32_pack, f32_product
from nanoserve.offline_bench import machine

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--rows', default='1,2,4,8,16,32'); p.add_argument('--rounds', type=int, default=9)
    p.add_argument('--threads', type=int, default=None); p.add_argument('--out', default='bench/results')
    a = p.parse_args(argv)
    if a.threads: torch.set_num_threads(a.threads)
    if fast.bf16_isa() is None: sys.exit("this CPU has no AVX512-BF16: the kernel does not run here")
    dots = c_library('bf16_dot_linear', fast.AMX_LINEAR_C, fast.AMX_LINEAR_FLAGS + ('-DNO_TILES',), declare=fast._declare_amx)
    amx = fast.amx_kernel() if fast.bf16_isa() == 'amx' else None
    g, th = torch.Generator().manual_seed(0), torch.get_num_threads()
    weights = []                                   # (in, out, {build: its packed copy}, oneDNN's, the float32 kernel's)
    for k, n in SHAPES:
        w = torch.randn(n, k, generator=g).bfloat16()
        own = {'dots': fast.amx_pack(w, dots), **({'amx': fast.amx_pack(w)} if amx is not None else {})}
        weights.append((k, n, own, torch.ops.mkldnn._reorder_linear_weight(w, 32), f32_pack(w.float())))
    nbytes = sum(k * n * 2 for k, n, *_ in weights)
    flat = torch.randn(nbytes // 4, generator=g)
    rows_out, lines = [], []
    for m in map(int, a.rows.split(',')):
        xs = {k: torch.randn(m, k, generator=g).bfloat16() for k in (576, 1536)}
        xf = {k: v.float() for k, v in xs.items()}
        outs = {n: torch.empty(m, n, dtype=torch.bfloat16) for _, n in SHAPES}
        def kernel(lib, name):
            for k, n, own, *_ in weights: lib.amx_linear(xs[k].data_ptr(), own[name].data_ptr(), None, outs[n].data_ptr(), m, n, k, th, 0)
        def onednn():
            for k, n, _, pd, _ in weights: torch.ops.mkldnn._linear_pointwise(xs[k], pd, None, 'none', [], '')
        def f32():
            for k, n, *_, pf in weights: f32_product(xf[k], pf, None, n)
        for k, n, own, pd, _ in weights[:4] + weights[-1:]:
            y, want = torch.empty(m, n, dtype=torch.bfloat16), torch.ops.mkldnn._linear_pointwise(xs[k], pd, None, 'none', [], '')
            assert dots.amx_linear(xs[k].data_ptr(), own['dots'].data_ptr(), None, y.data_ptr(), m, n, k, th, 0) == 0
            assert ((y.float() - want.float()).abs() <= want.float().abs() * 2 ** -7 + 1e-2).all(), (m, k, n)
        arms = {'dots': lambda: kernel(dots, 'dots'), 'onednn': onednn, 'f32': f32, 'sum': lambda: flat.sum()}
        if amx is not None: arms['amx'] = lambda: kernel(amx, 'amx')
        med, best = alternate(arms, a.rounds)
        row = dict(threads=th, rows=m, **{f'{k}_ms': round(v, 2) for k, v in med.items()}, **{f'{k}_best_ms': round(best[k], 2) for k in arms},
                   dots_vs_onednn=round(med['onednn'] / med['dots'], 3), dots_vs_f32=round(med['f32'] / med['dots'], 3),
                   dots_gbs=round(nbytes / med['dots'] / 1e6, 1), sum_gbs=round(nbytes / med['sum'] / 1e6, 1), machine=machine())
        rows_out.append(row)
        lines.append(f"{th} threads, {m:2d} rows: dots {med['dots']:5.1f} ms, "
                     f"oneDNN bfloat16 {med['onednn']:5.1f} ms (dots x{row['dots_vs_onednn']:.2f}), "
                     f"float32 kernel {med['f32']:5.1f} ms (x{row['dots_vs_f32']:.2f})" + (f", AMX build {med['amx']:5.1f} ms" if amx is not None else '')
                     + f"; dots read {row['dots_gbs']} GB/s, a sum {row['sum_gbs']} GB/s")
        print(lines[-1], flush=True)
    append_results(a.out, 'bf16_dot', rows_out, f"machine: {machine()}; {a.rounds} rounds, arms alternating, medians; dots checked against oneDNN to a bfloat16 step",
                   lines + ['command: python bench/bf16_dot.py ' + ' '.join(sys.argv[1:])])

if __name__ == '__main__': main()
