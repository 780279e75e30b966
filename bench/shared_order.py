#!/usr/bin/env python
"""One layer's attention in the batch-invariant shared order (Day 11) against the two it replaced, in one process,
alternating: a prefill chunk's tokens (the decode kernel's float32 order, 8 tokens a block, which the mode used before;
the chunk kernel, which `--no-batch-invariant` used), and a decode step's rows (the decode kernel).

    OMP_NUM_THREADS=1 taskset -c 1 python bench/shared_order.py --out bench/results/prefill

The default model's heads (9 over 3 KV heads, head size 64), bfloat16, K and V at random slots of a pool; the last
512-token chunk of 2,000-, 4,000- and 8,000-token prompts; decode steps of 1 and 32 rows at 300 keys and 1 row at 2,000
and 8,000. Each arm's median over --rounds rounds, the order flipping every round (`alternating.alternate`). Writes
OUT/shared_order.{csv,txt} with the machine line. Not part of CI."""
import argparse, ctypes, math, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import alternate, write_results
from nanoserve.attention import decode_kernel
from nanoserve.prefill_kernel import prefill_kernel, tile_order_kernel
from nanoserve.offline_bench import machine

H, KVH, D = 9, 3, 64

def inputs(L: int, rows: int, g: torch.Generator):
    "K and V of a pool of L + 64 slots, a random order of them, and `rows` queries."
    k, v = (torch.randn(L + 64, KVH, D, generator=g).bfloat16() for _ in range(2))
    return k, v, torch.randperm(L + 64, generator=g)[:L].contiguous(), torch.randn(rows, H, D, generator=g).bfloat16()

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--rounds', type=int, default=7)
    ap.add_argument('--out', default='bench/results/prefill')
    args = ap.parse_args()
    shared, old, chunk = tile_order_kernel(), decode_kernel(), prefill_kernel()
    if shared is None: sys.exit("no build of the shared order here (it needs AMX or AVX512-BF16)")
    g, th, scale = torch.Generator().manual_seed(0), torch.get_num_threads(), 1 / math.sqrt(D)
    rows, lines = [], [f"machine: {machine()}", f"{'case':<42}{'arm':<24}{'median ms':>10}{'fastest ms':>11}"]
    for L in (2000, 4000, 8000):
        n = 512
        k, v, slots, q = inputs(L, n, g)
        ctx, out = torch.arange(L - n, L) + 1, torch.empty(n, H, D, dtype=torch.bfloat16)
        a = (q.data_ptr(), k.data_ptr(), v.data_ptr(), slots.data_ptr(), ctx.data_ptr(), out.data_ptr(), n, H, KVH, D)
        arms = {'shared order': lambda: shared.tile_tokens_bf16(*a, scale, th),
                'decode kernel order': lambda: old.token_attention_bf16(*a, ctypes.c_float(scale), th),
                'chunk kernel': lambda: chunk.prefill_attention_bf16(q.data_ptr(), H * D, k.data_ptr(), v.data_ptr(),
                                                                     slots.data_ptr(), L, n, out.data_ptr(), H * D,
                                                                     H, KVH, D, ctypes.c_float(scale), th)}
        rows += report(f"chunk of {n} ending a {L}-token prompt", arms, args.rounds, lines)
    for R, L in ((1, 300), (32, 300), (1, 2000), (1, 8000)):
        k, v, _, q = inputs(L * R, R, g)
        win = torch.cat([torch.randperm(L * R + 64, generator=g)[:L] for _ in range(R)])
        ctx, out = torch.full((R,), L), torch.empty(R, H, D, dtype=torch.bfloat16)
        a = (q.data_ptr(), k.data_ptr(), v.data_ptr(), win.data_ptr(), L, ctx.data_ptr(), None, None, out.data_ptr(),
             R, H, KVH, D)
        arms = {'shared order': lambda: shared.tile_decode_bf16(*a, scale, th),
                'decode kernel': lambda: old.decode_attention_bf16(*a, ctypes.c_float(scale), th)}
        rows += report(f"decode of {R} row{'s' * (R > 1)} at {L} keys", arms, 10 * args.rounds, lines)
    write_results(args.out, 'shared_order', rows, lines)

def report(case: str, arms: dict, rounds: int, lines: list[str]) -> list[dict]:
    "Time `arms` alternating; a line each into `lines`, and their rows."
    med, best = alternate(arms, rounds)
    for arm in arms: lines.append(f"{case:<42}{arm:<24}{med[arm]:>10.3f}{best[arm]:>11.3f}")
    return [{'case': case, 'arm': arm, 'median_ms': med[arm], 'fastest_ms': best[arm], 'rounds': rounds,
             'threads': torch.get_num_threads(), 'machine': machine()} for arm in arms]

if __name__ == '__main__': main()
