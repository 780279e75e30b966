#!/usr/bin/env python
"""Experiment (not adopted): the engine's eager decode attention through an Inductor-compiled kernel that reads K/V from the
pool through the slot table itself, instead of Day 12's gather (`index_select`) then SDPA. Alternates the two in fresh
engines and prints profile_step.py's breakdown for each:

    OMP_NUM_THREADS=1 taskset -c 1 python bench/experiments/paged_inductor.py --rows 32

One run in the speed issue's third pass (AMD EPYC, avx512_bf16, one thread, bfloat16, 32 rows, 128-token contexts):
SDPA + gather 35-38 + 12-13 ms a step, the compiled kernel 47-50 ms (its time shows as compiled kernels): no gain.
"""
import argparse, math, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_step import measure, resolve_model
from nanoserve import attention as A

def paged(q, kc, vc, table, ctx):
    "Decode attention straight from the pool: scores, softmax and the weighted sum, K/V read through `table` [R, W]."
    R, H, D = q.shape; kvh = kc.shape[1]; G = H // kvh; W = table.shape[1]
    slots = table.clamp(min=0)
    qf = q.float().view(R, 1, kvh, G, D) * (1 / math.sqrt(D))
    s = (qf * kc[slots].float()[:, :, :, None, :]).sum(-1)                                  # [R, W, kv_heads, G]
    s = s.masked_fill((torch.arange(W, device=q.device) >= ctx[:, None])[:, :, None, None], float('-inf'))
    m = s.amax(1)
    p = torch.exp(s - m[:, None])
    o = (p[..., None] * vc[slots].float()[:, :, :, None, :]).sum(1)
    return (o / p.sum(1)[..., None]).reshape(R, H, D).to(q.dtype)

compiled = torch.compile(paged, dynamic=True)

@torch.compiler.disable
def attend(self, layer, q, k, v):
    m, kc, vc = self.meta, self.cache.k[layer], self.cache.v[layer]
    n, nd = m.num_tokens, m.num_decodes
    kc.index_copy_(0, m.slot_mapping, k[:n]); vc.index_copy_(0, m.slot_mapping, v[:n])
    out = torch.zeros_like(q)
    if nd:
        width = int(m.decode_context.max())
        out[:nd] = compiled(q[:nd], kc, vc, self.cache.slots[m.decode_rows, :width], m.decode_context)
    for c in m.chunks[nd:]:
        idx = self.cache.slots[c.row, :c.context_len].to(torch.int64)
        out[c.start:c.start + c.num_tokens] = A.sdpa_reference(q[c.start:c.start + c.num_tokens], kc[idx], vc[idx])
    return out

if __name__ == '__main__':
    ap = argparse.ArgumentParser(); ap.add_argument('--rows', type=int, default=32); ap.add_argument('--dtype', default='bfloat16')
    ap.add_argument('--repeats', type=int, default=2); args = ap.parse_args()
    path, sdpa = resolve_model('SmolLM2-135M-Instruct', print), A.PagedAttention.attend
    for _ in range(args.repeats):
        for name, f in (('sdpa', sdpa), ('paged-inductor', attend)):
            A.PagedAttention.attend = f
            r = measure(path, args.dtype, args.rows, 'fast')
            print(f"{name:<15} step {r['step_ms_p50']:6.1f} ms  " + ', '.join(f"{k[:-3]} {v:.1f}" for k, v in r.items() if k.endswith('_ms') and k != 'step_ms_p50'), flush=True)
