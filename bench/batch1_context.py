#!/usr/bin/env python
"""Batch 1 at long contexts: the decode call with the decode-attention kernel (a lone row's query heads split across the
threads, each part asking for its whole window, into L2, before reading it), and with no attention at all (a function that
returns at once: what the rest of the call costs), interleaved in one process. Each round starts with a sum over as many bytes
as the weights, and the rounds are sorted by its rate into the VM memory's slow and fast phases (a whole run can otherwise
fall in either). The kernel's earlier builds that this script once compared are in git (commit 14883e4 and before).

    python bench/batch1_context.py --contexts 128,512,1024,2048,4000

One request of `context` random tokens on the default model, prefilled, then its decode call timed as the engine makes it (the
same inputs every call, so the same window). The attention kernel is swapped through the call's kernel table, as
`bench/decode_call_split.py` does. Writes OUT/batch1_context.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, ctypes, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_call_split import NOTHING_C, step_inputs
from alternating import alternate_by_phase, write_results
from profile_step import ARMS
from nanoserve.core import c_library
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.sampling import SamplingParams
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import machine, sum_buffer
from nanoserve.weights import weight_bytes


def one_row_engine(path, dtype: str, context: int):
    "An engine holding one request of `context` random tokens, prefilled: every step from here is one decode."
    eng = build_engine(path, EngineConfig(dtype=dtype, max_batch_size=1, max_model_len=context + 256, **ARMS['fast']), batch=PersistentBatch)
    prompt = torch.randint(3, 40000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    while any(r.num_computed_tokens < context for r in eng.scheduler.running) or eng.scheduler.waiting: eng.step()
    return eng

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--contexts', default='128,512,1024,2048,4000')
    ap.add_argument('--dtype', default='bfloat16'); ap.add_argument('--rounds', type=int, default=61); ap.add_argument('--out', default='bench/results')
    ap.add_argument('--slow-gbs', type=float, default=40.0); ap.add_argument('--fast-gbs', type=float, default=45.0)
    args = ap.parse_args()
    path, rows_out, mach = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)), [], machine()
    nothing = c_library('decode_call_nothing', NOTHING_C, ('-O2', '-fPIC', '-shared'))
    for context in map(int, args.contexts.split(',')):
        eng = one_row_engine(path, args.dtype, context)
        call = eng.runner.decode_call
        if call is None: sys.exit(f"the decode call does not apply here: {eng.runner.decode_call_off}")
        ids, meta = step_inputs(eng)
        nbytes = weight_bytes(eng.model); x = sum_buffer(nbytes)               # each round's probe: the memory's rate then
        arms = {'kernel': call._kernels.attend, 'no attention': ctypes.cast(nothing.attend0, ctypes.c_void_p).value}
        with torch.inference_mode():
            def three_calls(ptr):
                def f():
                    call._kernels.attend = ptr
                    for _ in range(3): call(ids, meta)
                return f
            by_phase = alternate_by_phase({a: three_calls(ptr) for a, ptr in arms.items()}, args.rounds, x.sum, nbytes,
                                          args.slow_gbs, args.fast_gbs)
        call._kernels.attend = arms['kernel']
        for phase, (n, med) in by_phase.items():
            for a in arms:
                rows_out.append({'dtype': args.dtype, 'context': context, 'phase': phase, 'rounds': n, 'call': a, 'threads': torch.get_num_threads(),
                                 'ms_median': round(med[a] / 3, 2), 'machine': mach})
                print(rows_out[-1], file=sys.stderr)
        del eng, call
    lines = [f"machine: {mach}; {args.dtype}; one request, its decode call; {args.rounds} rounds of 3 calls per arm, interleaved, each round "
             f"begun by a sum over the weights' bytes (slow phase < {args.slow_gbs:g} GB/s < {args.fast_gbs:g} < fast); medians per call",
             f"{'context':>7}  {'phase':5s} {'rounds':>6}  {'call':18s} {'ms':>7}"]
    lines += [f"{r['context']:>7}  {r['phase']:5s} {r['rounds']:>6}  {r['call']:18s} {r['ms_median']:>7.2f}" for r in rows_out]
    write_results(args.out, 'batch1_context', rows_out, lines)

if __name__ == '__main__': main()
