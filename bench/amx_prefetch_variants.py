#!/usr/bin/env python
"""Five builds of Day 06's AMX kernel interleaved over one decode step's products (the default model's shapes, random bfloat16
weights): no prefetch (-DAHEAD=0), the engine's (8 KiB ahead, into L1), a hint to L2 instead, every other line, 4 KiB ahead.

    python bench/amx_prefetch_variants.py 1,8,32
    OMP_NUM_THREADS=1 taskset -c 1 python bench/amx_prefetch_variants.py 1,8,32

Prints each build's median / fastest of 10 rounds, ms. Not part of CI; bench/amx_prefetch.py is the two-arm A/B with its bits checked.
"""
import torch, time, sys, statistics
from nanoserve import fast
from nanoserve.core import c_library
th = torch.get_num_threads()
src = fast.AMX_LINEAR_C
variants = {'none': (src, ('-DAHEAD=0',)), 'T0': (src, ()),
            'T1': (src.replace('_MM_HINT_T0', '_MM_HINT_T1'), ()),
            'T0_every2': (src.replace('l < nb * 64; l += 64)', 'l < nb * 64; l += 128)'), ()),
            'T0_4k': (src, ('-DAHEAD=4096',))}
libs = {k: c_library('amxvar_' + k, s, fast.AMX_LINEAR_FLAGS + f, declare=fast._declare_amx) for k, (s, f) in variants.items()}
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]
g = torch.Generator().manual_seed(0)
ws = [(k, n, fast.amx_pack(torch.randn(n, k, generator=g).bfloat16())) for k, n in SHAPES]
for m in map(int, sys.argv[1].split(',')):
    xs = {k: torch.randn(m, k).bfloat16() for k in (576, 1536)}
    outs = {n: torch.empty(m, n, dtype=torch.bfloat16) for n in {n for _, n in SHAPES}}
    times = {k: [] for k in libs}
    for r in range(10):
        order = list(libs.items()) if r % 2 == 0 else list(libs.items())[::-1]
        for name, lib in order:
            t = time.perf_counter()
            for k, n, w in ws: lib.amx_linear(xs[k].data_ptr(), w.data_ptr(), None, outs[n].data_ptr(), m, n, k, th, 0)
            times[name].append(1e3 * (time.perf_counter() - t))
    print(f"{th} thr {m:2d} rows: " + '  '.join(f"{k} {statistics.median(v):5.1f}/{min(v):5.1f}" for k, v in times.items()), flush=True)
