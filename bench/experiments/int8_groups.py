#!/usr/bin/env python
"""What W8A8's activation groups cost the integer kernel, measured: its build as shipped (a scale a group of 64 inputs),
the same without the float32 work that scales each group's sums (wrong results: only to time it), the same with the
next group's tiles issued before the last group's float32 work (no gain), and the kernel with one group a row
(-DA8_GROUP=576: one scale a row, the first version's arithmetic), each against the bfloat16 kernel (batch-invariant
build, the engine's default) on the default model's three 576-wide products (qkv 960, o 576, gate_up 3072 outputs), at
32 and 2,000 rows: the best of 5 calls, medians of --rounds rounds taking the builds in turn.

    python bench/experiments/int8_groups.py --out bench/results/integer/groups.txt
"""
import argparse, ctypes, re, statistics, subprocess, tempfile, time
from pathlib import Path
import torch
from nanoserve.core import kernel_source
from nanoserve.integer import INT8_FLAGS, _declare, integer_product, w8a8_pack
from nanoserve.fast import FastLinear
from nanoserve.quant import quantize_int8
from nanoserve.offline_bench import machine

SHAPES = ((960, 576), (576, 576), (3072, 576))

def variants(src: str) -> dict[str, tuple[str, tuple]]:
    loop = re.search(r"                    for \(int r = 0; r < 16; r\+\+\) \{\n                        __m512 sr.*?\n"
                     r"                    \}\n", src, re.S).group(0)
    stores = src[src.index('                    _tile_stored(0, c, NB * 4);'):src.index(loop)]
    piped = src.replace(stores + loop, '                    if (gi > 0) EPI(c + ((gi - 1) & 1) * 16 * NB, gi - 1)\n'
                        + stores.replace('c, NB * 4', 'c + (gi & 1) * 16 * NB, NB * 4')
                                .replace('c + 16, NB', 'c + (gi & 1) * 16 * NB + 16, NB')
                                .replace('c + 32, NB', 'c + (gi & 1) * 16 * NB + 32, NB')
                                .replace('c + 48, NB', 'c + (gi & 1) * 16 * NB + 48, NB'))
    piped = piped.replace('                for (int r = 0; r < 16 && m0 + r < M; r++)\n',
                          '                EPI(c + ((G - 1) & 1) * 16 * NB, G - 1)\n'
                          '                for (int r = 0; r < 16 && m0 + r < M; r++)\n', 1)
    piped = piped.replace('int32_t c[16 * NB]', 'int32_t c[2 * 16 * NB]').replace('typedef struct { uint8_t palette', (
        '#define EPI(cb, g) for (int r = 0; r < 16; r++) { __m512 sr = _mm512_set1_ps(xs[(m0 + r) * G + (g)]); '
        'for (int j = 0; j < nv; j++) { float *fr = f + r * NB + 16 * j; '
        '__m512 d = _mm512_cvtepi32_ps(_mm512_load_si512((cb) + r * NB + 16 * j)); '
        '_mm512_store_ps(fr, _mm512_fmadd_ps(d, sr, _mm512_load_ps(fr))); } }\n'
        'typedef struct { uint8_t palette'), 1)
    assert piped.count('EPI(') == 3, 'the kernel changed: update this experiment'
    return {'groups of 64 (shipped)': (src, ()), 'groups of 64, no float32 work': (src.replace(loop, ''), ()),
            'groups of 64, pipelined': (piped, ()), 'one group a row': (src, ('-DA8_GROUP=576',))}

def build(name: str, source: str, extra: tuple, tmp: Path):
    (tmp/f'{name}.c').write_text(source)
    subprocess.run(['cc', *INT8_FLAGS, *extra, str(tmp/f'{name}.c'), '-o', str(tmp/f'{name}.so')], check=True)
    lib = ctypes.CDLL(str(tmp/f'{name}.so'))
    _declare(lib)
    return lib

def best_us(fn) -> float:
    fn()
    best = float('inf')
    for _ in range(5):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e6

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default='bench/results/integer/groups.txt')
    p.add_argument('--rounds', type=int, default=3)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix='int8-groups-'))
    libs = {k: build(f'v{i}', src, extra, tmp) for i, (k, (src, extra)) in enumerate(variants(kernel_source('int8_linear')).items())}
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(n, k, generator=g) * 0.05 for n, k in SHAPES]
    packs = {k: [w8a8_pack(*quantize_int8(w)) for w in ws] for k in libs}
    bf = []
    for w in ws:
        f = FastLinear(w.bfloat16())
        f.pack(amx=True, invariant=True)
        bf.append(f)
    # the one-group build packs its own layout (its corrections: one a column)
    for k, lib in libs.items():
        if k == 'one group a row':
            for i, w in enumerate(ws):
                qq, ss = quantize_int8(w)
                packs[k][i] = torch.empty(lib.w8a8_packed_size(*qq.shape), dtype=torch.uint8)
                lib.w8a8_pack(qq.contiguous().data_ptr(), ss.float().contiguous().data_ptr(), packs[k][i].data_ptr(), *qq.shape)
    times = {(k, m): [] for k in ['bfloat16', *libs] for m in (32, 2000)}
    for _ in range(args.rounds):
        for m in (32, 2000):
            xs = [torch.randn(m, k).bfloat16() for _, k in SHAPES]
            times['bfloat16', m].append(best_us(lambda: [f(x) for f, x in zip(bf, xs)]))
            for k, lib in libs.items():
                times[k, m].append(best_us(lambda: [integer_product('w8a8_linear', x, pk, None, n, lib=lib)
                                                    for x, pk, (n, _) in zip(xs, packs[k], SHAPES)]))
    lines = [f"machine: {machine()}", f"command: python bench/experiments/int8_groups.py --out {args.out} --rounds {args.rounds}",
             "the default model's three 576-wide products, microseconds (medians of the rounds' best of 5), x: against bfloat16",
             f"{'build':<34}{'32 rows':>18}{'2,000 rows':>20}"]
    for k in ['bfloat16', *libs]:
        cells = ''
        for m in (32, 2000):
            t = statistics.median(times[k, m])
            cells += f"{t:>12.0f} {statistics.median(times['bfloat16', m]) / t:.2f}x"
        lines.append(f"{k:<34}{cells}")
    Path(args.out).write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__': main()
