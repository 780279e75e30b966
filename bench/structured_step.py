#!/usr/bin/env python
"""What structured output costs per decode step: the engine's step with no grammar in the batch, and with some or all rows under one.

    python bench/structured_step.py                       # default model, machine's dtype, 1, 8 and 32 rows
    python bench/structured_step.py --rows 32 --steps 40

Each arm is one engine (reused across arms, requests drained between them): `rows` chat requests decode past their
prefill, then `steps` decode steps are timed one by one. The grammar is a JSON schema for a long array of small
integers, so no constrained request finishes inside the timed window; its masks are as costly as a JSON number's get.
Arms: `none` (no grammar), `half` (every other row constrained), `all`. The step's grammar work is also timed alone
(`nanoserve.grammar.allowed_tokens` for the constrained rows at the step's state). Writes OUT/structured_step.{csv,txt}
with the machine line. Not part of CI.
"""
import argparse, sys, time
from pathlib import Path
import torch
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.sampling import SamplingParams
from nanoserve.grammar import Structured, allowed_tokens
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import write_csv, machine
from nanoserve.core import auto_dtype

LONG = Structured.json_schema({'type': 'array', 'items': {'type': 'integer', 'minimum': 0, 'maximum': 999}, 'minItems': 400})

def measure(eng, rows: int, arm: str, steps: int) -> dict:
    msgs = [{'role': 'user', 'content': 'List the numbers from one to a thousand.'}]
    for i in range(rows):
        constrained = arm == 'all' or (arm == 'half' and i % 2 == 0)
        eng.add_request(msgs, SamplingParams(max_tokens=steps + 40, temperature=0.7, seed=i, ignore_eos=not constrained,
                                             structured=LONG if constrained else None))
    while eng.scheduler.waiting or any(r.num_output_tokens == 0 for r in eng.scheduler.running): eng.step()
    for _ in range(3): eng.step()
    ts, masks = [], []
    for _ in range(steps):
        ms = [r.matcher for r in eng.scheduler.running if r.matcher is not None]
        if ms:
            t = time.perf_counter(); allowed_tokens(eng.grammars, ms); masks.append(time.perf_counter() - t)
        t = time.perf_counter(); eng.step(); ts.append(time.perf_counter() - t)
    while eng.has_unfinished():
        for r in list(eng.scheduler.running) + list(eng.scheduler.waiting): eng.abort(r.request_id)
    p50 = lambda xs: 1e3 * sorted(xs)[len(xs) // 2] if xs else 0.0
    return {'rows': rows, 'arm': arm, 'constrained_rows': {'none': 0, 'half': (rows + 1) // 2, 'all': rows}[arm],
            'step_ms_p50': round(p50(ts), 2), 'mask_ms_p50': round(p50(masks), 3)}

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--dtype', default=auto_dtype()[0])
    p.add_argument('--rows', default='1,8,32'); p.add_argument('--steps', type=int, default=30)
    p.add_argument('--out', default='bench/results')
    args = p.parse_args()
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr))
    rows_list = [int(r) for r in args.rows.split(',')]
    eng = build_engine(path, EngineConfig(dtype=args.dtype, max_batch_size=max(rows_list), max_model_len=1024), batch=PersistentBatch)
    out, mach = [], machine()
    for rows in rows_list:
        for arm in (('none', 'all') if rows == 1 else ('none', 'half', 'all')):
            out.append({**measure(eng, rows, arm, args.steps), 'dtype': args.dtype, 'machine': mach})
            print(out[-1], file=sys.stderr, flush=True)
    d = Path(args.out); d.mkdir(parents=True, exist_ok=True)
    write_csv(out, d/'structured_step.csv')
    base = {r['rows']: r['step_ms_p50'] for r in out if r['arm'] == 'none'}
    lines = [f"machine: {mach}; {args.dtype}; a JSON schema grammar (an array of integers); decode steps, p50 of {args.steps}",
             'rows  arm    constrained  step ms  x no grammar  masks alone ms']
    lines += [f"{r['rows']:>4}  {r['arm']:<5}  {r['constrained_rows']:>11}  {r['step_ms_p50']:7.1f}  {r['step_ms_p50'] / base[r['rows']]:12.2f}  {r['mask_ms_p50']:14.3f}" for r in out]
    lines.append(f"command: python bench/structured_step.py {' '.join(sys.argv[1:])}".rstrip())
    (d/'structured_step.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
