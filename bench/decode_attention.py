#!/usr/bin/env python
"""Decode attention over the paged pool, several ways, on the default model's shape: time per step of 30 layers and error against float64.

    python bench/decode_attention.py                      # 32 rows, contexts up to 160, 1 and 2 threads, float32 and bfloat16
    python bench/decode_attention.py --rows 8 --width 512 --threads 2 --arms sdpa,kernel
    python bench/decode_attention.py --rows 1 --width 1024 --threads 2 --arms kernel-c,kernel --evict-mb 8

Arms:
- `sdpa`: Day 12's reference: K/V gathered from the pool through the slot table (`index_select`), then
  `scaled_dot_product_attention` with a boolean mask, a KV head's query heads as its queries (no K/V expansion);
- `kernel`: Day 12's C kernel as the engine runs it (the pool read in place, rows split across the threads);
- `kernel-c`: the same kernel called straight through ctypes, without `kernel_attention`'s checks (some microseconds a
  layer, which at one row and short contexts is much of the time); it must give the kernel's bits;
- `matmul`: the same gather, then scores by `matmul` in the model's dtype, a float32 softmax, and `matmul` with V;
- `matmul-f32`: scores from float32 operands (the accuracy `sdpa` keeps in bfloat16, at the price of converting K);
- `compiled`: the gather and the attention in one Inductor kernel (dynamic shapes), the pool read through the slot
  indices inside the kernel: no gathered copy of K/V.

Each layer has a pool of its own (blocks of 16 slots, scattered over it, like the engine's), and an arm's step runs all the
layers in turn, so a layer's window is not in the cache when it is read, as in the engine, where the products between two
layers' attention evict it. The arms alternate over --repeats rounds (this VM's speed drifts); the table gives each arm's
fastest and median step. Writes OUT/decode_attention.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, math, statistics, sys, time
from pathlib import Path
import torch
import torch.nn.functional as F
from nanoserve.offline_bench import write_csv, machine
from nanoserve.attention import kernel_attention


def setup(dtype, rows, width, layers, kvh=3, groups=3, D=64, pool=8192, block=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    pools = [((2 * torch.randn(pool, kvh, D, generator=g)).to(dtype), torch.randn(pool, kvh, D, generator=g).to(dtype)) for _ in range(layers)]
    per_row = math.ceil(width / block)
    blocks = torch.randperm(pool // block, generator=g)[:rows * per_row].view(rows, per_row, 1) * block
    win = (blocks + torch.arange(block)).view(rows, -1)[:, :width].flatten()                    # [rows * width] slots
    ctx = torch.randint(width * 5 // 8, width + 1, (rows,), generator=g); ctx[0] = width
    q = (2 * torch.randn(rows, kvh * groups, D, generator=g)).to(dtype)
    return dict(q=q, pools=pools, win=win, ctx=ctx, kvh=kvh, groups=groups, D=D)

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

def kernel(q, kc, vc, win, ctx, kvh, groups, D):
    return kernel_attention(q, kc, vc, win, ctx)

def direct_kernel():
    "The engine's decode kernel called straight through ctypes."
    from nanoserve.attention import decode_kernel
    lib = decode_kernel()
    def run(q, kc, vc, win, ctx, kvh, groups, D):
        out = torch.empty_like(q); R = q.shape[0]
        f = lib.decode_attention_bf16 if q.dtype == torch.bfloat16 else lib.decode_attention_f32
        assert f(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), win.data_ptr(), win.numel() // R, ctx.data_ptr(), None, None, out.data_ptr(), R, q.shape[1], kvh, D,
                 1 / math.sqrt(D), torch.get_num_threads()) == 0
        return out
    return run

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rows', type=int, default=32); ap.add_argument('--width', type=int, default=160)
    ap.add_argument('--threads', default='1,2'); ap.add_argument('--dtypes', default='float32,bfloat16')
    ap.add_argument('--layers', type=int, default=30); ap.add_argument('--repeats', type=int, default=7)
    ap.add_argument('--evict-mb', type=int, default=0, help="before each layer's call, read this many MB (as the products between two "
                    "layers' attention stream a layer's weights: the default model's are 7 MB in bfloat16); 0: none")
    ap.add_argument('--arms', default='sdpa,kernel,matmul,matmul-f32,compiled'); ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    every = {'sdpa': sdpa, 'kernel': kernel, 'kernel-c': direct_kernel(), 'matmul': matmul,
             'matmul-f32': lambda *a, **k: matmul(*a, **k, f32=True), 'compiled': torch.compile(fused, dynamic=True)}
    arms = {a: every[a] for a in args.arms.split(',')}
    rows, mach = [], machine()
    with torch.inference_mode():
        for dt in args.dtypes.split(','):
            x = setup(getattr(torch, dt), args.rows, args.width, args.layers)
            pools, rest = x.pop('pools'), x
            ref = exact(kc=pools[0][0], vc=pools[0][1], **rest)
            for threads in map(int, args.threads.split(',')):
                torch.set_num_threads(threads)
                first, err, times = {}, {}, {a: [] for a in arms}
                for name, f in arms.items():
                    t0 = time.perf_counter(); out = f(kc=pools[0][0], vc=pools[0][1], **rest); first[name] = time.perf_counter() - t0
                    err[name] = (out.double() - ref).abs().max().item()
                    if name == 'kernel-c':                                          # the same kernel, called another way: the same bits
                        assert torch.equal(out, kernel(kc=pools[0][0], vc=pools[0][1], **rest))
                flush = torch.ones(args.evict_mb << 18)
                for i in range(args.repeats):
                    for name, f in (arms.items() if i % 2 == 0 else list(arms.items())[::-1]):
                        took = 0.0
                        for kc, vc in pools:
                            if args.evict_mb: flush.sum()
                            t0 = time.perf_counter(); f(kc=kc, vc=vc, **rest); took += time.perf_counter() - t0
                        times[name].append(took * 1e3)
                for name in arms:
                    best, med = min(times[name]), statistics.median(times[name])
                    rows.append(dict(dtype=dt, arm=name, rows=args.rows, width=args.width, threads=threads, layers=args.layers,
                                     step_ms_min=round(best, 2), step_ms_median=round(med, 2), ms_per_layer=round(best / args.layers, 4),
                                     first_call_s=round(first[name], 2), max_err_vs_float64=float(f'{err[name]:.3g}'), machine=mach))
                    print(rows[-1], file=sys.stderr, flush=True)
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out/'decode_attention.csv')
    lines = [f"machine: {mach}; {args.rows} rows, contexts up to {args.width}, 3 KV heads x 3 query heads, head dim 64; {args.layers} layers "
             f"(each its own pool) a step"
             f"{f', {args.evict_mb} MB read before each' if args.evict_mb else ''}; fastest and median of {args.repeats} alternating rounds",
             'dtype      threads  arm               step ms (min)  (median)  ms/layer  first call s  max err vs float64']
    lines += [f"{r['dtype']:9s}  {r['threads']:7d}  {r['arm']:16s}  {r['step_ms_min']:13.1f}  {r['step_ms_median']:8.1f}  {r['ms_per_layer']:8.3f}  "
              f"{r['first_call_s']:12.2f}  {r['max_err_vs_float64']:.3g}" for r in rows]
    lines.append(f"command: python bench/decode_attention.py {' '.join(sys.argv[1:])}".rstrip())
    (out/'decode_attention.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
