#!/usr/bin/env python
"""Decode attention over the paged pool, four ways, on one layer of the default model's shape: time per layer and error against float64.

    python bench/decode_attention.py                      # 32 rows, contexts up to 160, 1 thread, float32 and bfloat16
    python bench/decode_attention.py --rows 8 --width 512 --threads 2

Arms:
- `sdpa`: what Day 12 runs: K/V gathered from the pool through the slot table (`index_select`), then
  `scaled_dot_product_attention` with a boolean mask, a KV head's query heads as its queries (no K/V expansion);
- `matmul`: the same gather, then scores by `matmul` in the model's dtype, a float32 softmax, and `matmul` with V;
- `matmul-f32`: scores from float32 operands (the accuracy `sdpa` keeps in bfloat16, at the price of converting K);
- `compiled`: the gather and the attention in one Inductor kernel (dynamic shapes), the pool read through the slot
  indices inside the kernel: no gathered copy of K/V.

The slot table is paged like the engine's (blocks of 16 slots, scattered over a pool of 40k slots). Writes
OUT/decode_attention.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, math, sys, time
from pathlib import Path
import torch
import torch.nn.functional as F
from nanoserve.offline_bench import write_csv, machine

def setup(dtype, rows, width, kvh=3, groups=3, D=64, pool=40_000, block=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    kc, vc = (2 * torch.randn(pool, kvh, D, generator=g)).to(dtype), torch.randn(pool, kvh, D, generator=g).to(dtype)
    per_row = math.ceil(width / block)
    blocks = torch.randperm(pool // block, generator=g)[:rows * per_row].view(rows, per_row, 1) * block
    win = (blocks + torch.arange(block)).view(rows, -1)[:, :width].flatten()                    # [rows * width] slots
    ctx = torch.randint(width * 5 // 8, width + 1, (rows,), generator=g); ctx[0] = width
    q = (2 * torch.randn(rows, kvh * groups, D, generator=g)).to(dtype)
    return dict(q=q, kc=kc, vc=vc, win=win, ctx=ctx, kvh=kvh, groups=groups, D=D)

def sdpa(q, kc, vc, win, ctx, kvh, groups, D):
    n, w = q.shape[0], win.numel() // q.shape[0]
    K = kc.index_select(0, win).view(n, w, kvh, D).transpose(1, 2)
    V = vc.index_select(0, win).view(n, w, kvh, D).transpose(1, 2)
    mask = (torch.arange(w) < ctx[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q.view(n, kvh, groups, D), K, V, attn_mask=mask).reshape(n, kvh * groups, D)

def exact(q, kc, vc, win, ctx, kvh, groups, D):
    d = lambda t: t.double()
    return sdpa(d(q), d(kc), d(vc), win, ctx, kvh, groups, D)

def matmul(q, kc, vc, win, ctx, kvh, groups, D, f32=False):
    n, w = q.shape[0], win.numel() // q.shape[0]
    K = kc.index_select(0, win).view(n, w, kvh, D).permute(0, 2, 3, 1)          # [n, kvh, D, w]
    V = vc.index_select(0, win).view(n, w, kvh, D).transpose(1, 2)              # [n, kvh, w, D]
    qq = q.view(n, kvh, groups, D)
    s = torch.matmul(qq.float(), K.float()) if f32 else torch.matmul(qq, K).float()
    s = s / math.sqrt(D) + torch.where(torch.arange(w) < ctx[:, None], 0.0, float('-inf'))[:, None, None, :]
    return torch.matmul(torch.softmax(s, -1).to(q.dtype), V).reshape(n, kvh * groups, D)

def fused(q, kc, vc, win, ctx, kvh: int, groups: int, D: int):
    "Attention with the pool read through `win` by the kernel itself (compile it): scores, softmax and sum per (row, key)."
    n = q.shape[0]; w = win.numel() // n
    K = kc[win].view(n, w, kvh, 1, D).float()
    V = vc[win].view(n, w, kvh, 1, D).float()
    s = (q.view(n, 1, kvh, groups, D).float() * K).sum(-1) / math.sqrt(D)          # [n, w, kvh, groups]
    s = s.masked_fill((torch.arange(w) >= ctx[:, None]).view(n, w, 1, 1), float('-inf'))
    p = torch.softmax(s, 1)
    return (p[..., None] * V).sum(1).reshape(n, kvh * groups, D).to(q.dtype)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rows', type=int, default=32); ap.add_argument('--width', type=int, default=160)
    ap.add_argument('--threads', type=int, default=1); ap.add_argument('--dtypes', default='float32,bfloat16')
    ap.add_argument('--iters', type=int, default=100); ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    compiled = torch.compile(fused, dynamic=True)
    arms = {'sdpa': sdpa, 'matmul': matmul, 'matmul-f32': lambda *a, **k: matmul(*a, **k, f32=True), 'compiled': compiled}
    rows, mach = [], machine()
    with torch.inference_mode():
        for dt in args.dtypes.split(','):
            x = setup(getattr(torch, dt), args.rows, args.width)
            ref = exact(**x)
            for name, f in arms.items():
                t0 = time.perf_counter(); out = f(**x); first = time.perf_counter() - t0
                for _ in range(5): f(**x)
                t0 = time.perf_counter()
                for _ in range(args.iters): f(**x)
                ms = (time.perf_counter() - t0) / args.iters * 1e3
                rows.append(dict(dtype=dt, arm=name, rows=args.rows, width=args.width, threads=args.threads, ms_per_layer=round(ms, 4),
                                 step_ms_30_layers=round(30 * ms, 2), first_call_s=round(first, 2),
                                 max_err_vs_float64=float(f'{(out.double() - ref).abs().max():.3g}'), machine=mach))
                print(rows[-1], file=sys.stderr, flush=True)
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out/'decode_attention.csv')
    lines = [f"machine: {mach}; {args.threads} thread(s); {args.rows} rows, contexts up to {args.width}, 3 KV heads x 3 query heads, head dim 64",
             'dtype      arm          ms/layer  x30 layers  first call s  max err vs float64']
    lines += [f"{r['dtype']:9s}  {r['arm']:11s}  {r['ms_per_layer']:8.3f}  {r['step_ms_30_layers']:10.1f}  {r['first_call_s']:12.2f}  {r['max_err_vs_float64']:.3g}" for r in rows]
    lines.append(f"command: python bench/decode_attention.py {' '.join(sys.argv[1:])}".rstrip())
    (out/'decode_attention.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
