#!/usr/bin/env python
"""What Day 13's one decode call spends its time on: the call timed whole, and again with one family of kernels swapped for
functions that return at once (attention, the products, the small operators, all of them), interleaved in one process.

    python bench/decode_call_split.py --rows 1,8,32
    python bench/decode_call_split.py --dtype float32 --rows 1,8,32

The difference between the whole call and a call without a family is that family's time; the call with nothing left is the
loop itself (the K/V copies, the residual sums). In float32 the products are swapped through the table's `linear`, which the loop
calls in preference to `linear_void` (the float32 kernel's) whenever it is set. The logits of the swapped calls are garbage and are not used. Uses profile_step's
engine (the default model, 128-token random prompts). Writes OUT/decode_call_split.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, ctypes, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_step import decoding_engine
from nanoserve.core import c_library
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import write_csv, machine

NOTHING_C = r'''
#include <stdint.h>
int linear0(const void *x, const void *w, const void *b, void *o, int64_t M, int64_t N, int64_t K, int t) { return 0; }
void norm0(const void *x, int64_t l, const void *w, void *o, int64_t r, int64_t n, float e) {}
int rope0(void *x, int64_t l, const int64_t *p, const float *c, const float *s, int64_t m, int64_t t, int64_t h, int64_t d) { return 0; }
void silu_mul0(const void *g, void *o, int64_t r, int64_t i) {}
int attend0(const void *q, const void *k, const void *v, const int64_t *w, int64_t W, const int64_t *c, const void *nk, const void *nv, void *o,
            int64_t R, int64_t H, int64_t KVH, int64_t D, float s, int t) { return 0; }
'''
FAMILIES = {'whole call': (), 'without attention': ('attend',), 'without products': ('linear',),
            'without small ops': ('norm', 'rope', 'silu_mul'), 'loop alone': ('attend', 'linear', 'norm', 'rope', 'silu_mul')}

def step_inputs(eng):
    "The input ids and metadata of the engine's next decode step, as its runner receives them (the step itself runs too)."
    seen, real, call = {}, eng.runner.logits, eng.runner.decode_call
    def spy(*a): seen['a'] = a; return real(*a)
    eng.runner.logits, eng.runner.decode_call = spy, None      # since the eighteenth pass a decode step skips `logits` for `DecodeCall.run`
    try: eng.step()
    finally: eng.runner.logits, eng.runner.decode_call = real, call
    ids, _, meta, _ = seen['a']
    return ids, meta

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--rows', default='1,8,32'); ap.add_argument('--dtype', default='bfloat16')
    ap.add_argument('--rounds', type=int, default=10); ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    path, rows_out = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)), []
    nothing = c_library('decode_call_nothing', NOTHING_C, ('-O2', '-fPIC', '-shared'))
    for rows in map(int, args.rows.split(',')):
        eng = decoding_engine(path, args.dtype, rows, 'fast', max_tokens=100_000)
        call = eng.runner.decode_call
        if call is None: sys.exit(f"the decode call does not apply here: {eng.runner.decode_call_off}")
        ids, meta = step_inputs(eng)
        real = {f: getattr(call._kernels, f) for f in ('linear', 'norm', 'rope', 'silu_mul', 'attend')}
        times = {k: [] for k in FAMILIES}
        with torch.inference_mode():
            for _ in range(args.rounds):
                for k, off in FAMILIES.items():
                    for f, v in real.items(): setattr(call._kernels, f, ctypes.cast(getattr(nothing, f + '0'), ctypes.c_void_p).value if f in off else v)
                    t = time.perf_counter()
                    for _ in range(3): call(ids, meta)
                    times[k].append((time.perf_counter() - t) / 3 * 1e3)
        for f, v in real.items(): setattr(call._kernels, f, v)
        for k, ts in times.items():
            rows_out.append({'dtype': args.dtype, 'rows': rows, 'call': k, 'threads': torch.get_num_threads(), 'ms_min': round(min(ts), 2),
                             'ms_median': round(sorted(ts)[len(ts) // 2], 2), 'machine': machine()})
            print(rows_out[-1], file=sys.stderr)
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    write_csv(rows_out, out/'decode_call_split.csv')
    lines = [f"machine: {machine()}; {args.dtype}; 128-token prompts; {args.rounds} rounds of 3 calls per variant, interleaved",
             f"{'rows':>4}  {'call':20s} {'ms (min)':>9} {'(median)':>9}"]
    lines += [f"{r['rows']:>4}  {r['call']:20s} {r['ms_min']:>9.1f} {r['ms_median']:>9.1f}" for r in rows_out]
    lines.append('command: python bench/decode_call_split.py ' + ' '.join(sys.argv[1:]))
    (out/'decode_call_split.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
