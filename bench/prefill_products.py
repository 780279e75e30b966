#!/usr/bin/env python
"""Wide products (prefill chunks) through nanoserve's own bfloat16 kernel against oneDNN's packed product.

    python bench/prefill_products.py [--rows 64,256,1024] [--rounds 7] [--out DIR]

Why it exists: since the weights are resident once in every mode, the own kernel's packed copy takes every row count
with or without `--batch-invariant`, where before the non-invariant mode kept a oneDNN copy beside it for products of
more than 32 rows. This measures what that costs. Shapes: the default model's fused products (q/k/v 960x576,
gate/up 3072x576, down 576x1536) and SmolLM2-1.7B's (q/k/v 6144x2048, gate/up 16384x2048, down 2048x8192). For each
shape and row count, the arms (own kernel, its batch-invariant build, oneDNN) run in turn, the order flipped each
round, and the median of the rounds is kept; GFLOP/s is 2 rows x out x in over it. Writes OUT/prefill_products.csv
and .txt with the machine and the command."""
import argparse, statistics, sys, time
from pathlib import Path
import torch
from nanoserve.fast import amx_kernel, amx_pack, amx_product
from nanoserve.offline_bench import machine, write_csv

SHAPES = {'default q/k/v': (960, 576), 'default gate/up': (3072, 576), 'default down': (576, 1536),
          '1.7B q/k/v': (6144, 2048), '1.7B gate/up': (16384, 2048), '1.7B down': (2048, 8192)}


def seconds(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rows', default='64,256,1024')
    p.add_argument('--rounds', type=int, default=7)
    p.add_argument('--out', type=Path, default=Path(__file__).resolve().parent / 'out' / 'prefill_products')
    a = p.parse_args()
    if amx_kernel() is None: sys.exit("this CPU has no AMX or AVX512-BF16: nanoserve's bfloat16 kernel does not apply")
    g, rows_out = torch.Generator().manual_seed(0), []
    from nanoserve.prefill_bench import arithmetic_peak, product_kind
    kind = product_kind('bfloat16')
    peak = arithmetic_peak(kind, torch.get_num_threads()) / 1e9          # the best bfloat16 instruction, these threads
    print(f"peak: {kind} {peak:.1f} GFLOP/s on {torch.get_num_threads()} thread(s)", flush=True)
    for name, (out, inp) in SHAPES.items():
        w = (torch.randn(out, inp, generator=g) / inp ** 0.5).bfloat16()
        own, dnn = amx_pack(w), torch.ops.mkldnn._reorder_linear_weight(w, 32)
        for rows in map(int, a.rows.split(',')):
            x = torch.randn(rows, inp, generator=g).bfloat16()
            arms = {'own': lambda: amx_product(x, own, None, out), 'own_invariant': lambda: amx_product(x, own, None,
                    out, True), 'onednn': lambda: torch.ops.mkldnn._linear_pointwise(x, dnn, None, 'none', [], '')}
            for f in arms.values(): f()
            times = {k: [] for k in arms}
            for r in range(a.rounds):
                for k in (list(arms) if r % 2 == 0 else list(arms)[::-1]): times[k].append(seconds(arms[k]))
            med = {k: statistics.median(v) for k, v in times.items()}
            flops = 2 * rows * out * inp
            row = dict(shape=name, out=out, inp=inp, rows=rows,
                       **{f'{k}_ms': round(v * 1e3, 3) for k, v in med.items()},
                       **{f'{k}_gflops': round(flops / v / 1e9, 1) for k, v in med.items()},
                       own_over_onednn=round(med['onednn'] / med['own'], 3), peak_kind=kind,
                       peak_gflops=round(peak, 1), own_peak_share=round(flops / med['own'] / 1e9 / peak, 3),
                       onednn_peak_share=round(flops / med['onednn'] / 1e9 / peak, 3))
            rows_out.append(row)
            print(f"{name:<16} {out:>6}x{inp:<5} rows {rows:>5}: own {row['own_gflops']:>7} "
                  f"invariant {row['own_invariant_gflops']:>7} oneDNN {row['onednn_gflops']:>7} GFLOP/s  "
                  f"own/oneDNN speed {row['own_over_onednn']:.2f}x, own {100 * row['own_peak_share']:.0f}% of the peak",
                  flush=True)
    command = 'python bench/prefill_products.py ' + ' '.join(sys.argv[1:])
    write_csv(rows_out, a.out / 'prefill_products.csv')
    lines = [f"machine: {machine()}", f"command: {command.strip()}", f"peak: {kind} {peak:.1f} GFLOP/s", '']
    lines += [f"{r['shape']:<16} rows {r['rows']:>5}: own {r['own_gflops']:>7} "
              f"invariant {r['own_invariant_gflops']:>7} oneDNN {r['onednn_gflops']:>7} GFLOP/s, "
              f"own/oneDNN {r['own_over_onednn']:.2f}x, own {100 * r['own_peak_share']:.0f}% and oneDNN "
              f"{100 * r['onednn_peak_share']:.0f}% of the peak" for r in rows_out]
    (a.out / 'prefill_products.txt').write_text('\n'.join(lines) + '\n')
    print(f"-> {a.out}/prefill_products.{{csv,txt}} ({machine()})")


if __name__ == '__main__':
    main()
