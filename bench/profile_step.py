#!/usr/bin/env python
"""Where a decode step's time goes: the engine's step timed and profiled (torch.profiler) on one model, per dtype, rows and arm.

    python bench/profile_step.py                          # default model; float32 and bfloat16; 1 and 32 rows; every arm
    python bench/profile_step.py --dtypes bfloat16 --rows 1 --arms reference,fast,fast+compile

Arms: `reference` (Day 05's layers: fuse_projections, gemv and pack_weights off), `fused` (one product for q/k/v and
for gate/up), `fused+gemv` (and one-row products through the compiled GEMV), `onednn` (and oneDNN's packed weights at every row count:
the third pass's default), `amx` (and Day 06's AMX kernel for products of up to 32 rows where the CPU has AMX), `layers` (and
Day 06's small operators in C: the fourth pass's default), `fast` (and a step of decodes as one C call, Day 13: the default), `fast+compile` (the same, the decode step recorded by the compile recorder, as `--cuda-graphs` does on CPU). Each arm is a fresh engine: `rows` requests with
128-token random prompts, decoded past their prefill; then 20 decode steps timed and 5 profiled. Self CPU time is
grouped by op into GEMM, attention, K/V gather and write, compiled kernels, and the rest (Python, small ops,
sampling). Writes OUT/profile_step.csv and OUT/profile_step.txt with the machine line. Not part of CI.
"""
import argparse, sys, time
from pathlib import Path
import torch
from torch.profiler import profile, ProfilerActivity
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.sampling import SamplingParams
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import write_csv, machine

ARMS = {'reference': dict(fuse_projections=False, gemv=False, pack_weights=False), 'fused': dict(gemv=False, pack_weights=False),
        'fused+gemv': dict(pack_weights=False), 'onednn': dict(amx_linear=False, small_ops=False), 'no-own-products': dict(amx_linear=False), 'amx': dict(small_ops=False), 'layers': dict(decode_call=False), 'fast': {},
        'fast+compile': dict(bucket_decode=True, persist_inputs=True, capture_decode=True)}
GROUPS = (('one decode call', ('nanoserve::decode_call',)), ('gemm', ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::linear', 'aten::matmul', '_linear_pointwise', 'amx_linear', 'f32_linear')),
          ('attention', ('scaled_dot_product', 'flash_attention', 'decode_attention_kernel')),
          ('kv gather/write', ('aten::index_select', 'aten::index_copy', 'aten::index', 'aten::gather')),
          ('compiled kernels', ('Compiled', 'inductor', 'graph_', 'cpp_fused', 'kernel')))

def group_of(name: str) -> str:
    for g, keys in GROUPS:
        if any(k in name for k in keys): return g
    return 'other ops'

def decoding_engine(path, dtype: str, rows: int, arm: str, context: int = 128, warm_width: int = 256, max_tokens: int = 400, max_model_len: int = 1024):
    "An engine of `arm` with `rows` requests of `context` random tokens, decoded past their prefill: every step from here is `rows` decodes."
    cfg = EngineConfig(dtype=dtype, max_batch_size=rows, max_model_len=max_model_len, **ARMS[arm],
                       **({'warm_rows': rows, 'warm_width': warm_width} if 'compile' in arm else {}))
    eng = build_engine(path, cfg, batch=PersistentBatch)
    g = torch.Generator().manual_seed(0)
    for _ in range(rows):
        eng.add_request(torch.randint(3, 40000, (context,), generator=g).tolist(), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while any(r.num_computed_tokens < context for r in eng.scheduler.running) or eng.scheduler.waiting: eng.step()
    return eng

def measure(path, dtype: str, rows: int, arm: str, context: int = 128, steps: int = 20) -> dict:
    eng = decoding_engine(path, dtype, rows, arm, context)
    for _ in range(3): eng.step()
    ts = []
    for _ in range(steps):
        t = time.perf_counter(); eng.step(); ts.append(time.perf_counter() - t)
    n = 5
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(n): eng.step()
    by = {g: 0.0 for g, _ in GROUPS} | {'other ops': 0.0}
    for e in p.key_averages(): by[group_of(e.key)] += e.self_cpu_time_total / 1e3 / n
    step = 1e3 * sorted(ts)[len(ts) // 2]
    prof_step = sum(by.values())
    row = {'dtype': dtype, 'rows': rows, 'arm': arm, 'step_ms_p50': round(step, 2), 'tok_s': round(rows / step * 1e3, 1)}
    row |= {f'{g}_ms': round(v * step / prof_step, 2) for g, v in by.items()}     # profiled shares, scaled to the unprofiled step
    row['machine'] = machine()
    return row

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--dtypes', default='float32,bfloat16')
    p.add_argument('--rows', default='1,32'); p.add_argument('--arms', default=','.join(ARMS))
    p.add_argument('--out', default='bench/results')
    a = p.parse_args()
    path = resolve_model(a.model, log=lambda m: print(m, file=sys.stderr))
    rows = []
    for dtype in a.dtypes.split(','):
        for r in map(int, a.rows.split(',')):
            for arm in a.arms.split(','):
                rows.append(measure(path, dtype, r, arm)); x = rows[-1]
                print(f"{dtype:<9} {r:>3} rows {arm:<13} {x['step_ms_p50']:8.1f} ms {x['tok_s']:7.1f} tok/s  " +
                      '  '.join(f"{g} {x[g + '_ms']:.1f}" for g in [g for g, _ in GROUPS] + ['other ops']), flush=True)
    out = Path(a.out); write_csv(rows, out/'profile_step.csv')
    lines = [f"machine: {machine()}", f"{'dtype':<9} {'rows':>4} {'arm':<13} {'step ms':>8} {'tok/s':>7}  " + '  '.join(f"{g + ' ms':>18}" for g in [g for g, _ in GROUPS] + ['other ops'])]
    for x in rows:
        lines.append(f"{x['dtype']:<9} {x['rows']:>4} {x['arm']:<13} {x['step_ms_p50']:>8.1f} {x['tok_s']:>7.1f}  " +
                     '  '.join(f"{x[g + '_ms']:>18.1f}" for g in [g for g, _ in GROUPS] + ['other ops']))
    (out/'profile_step.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
