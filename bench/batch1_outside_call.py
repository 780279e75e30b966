#!/usr/bin/env python
"""The part of a batch-1 decode step outside Day 13's C call (Python: scheduling, the call's own wrapper, sampling, detokenizing),
as the runner now hands the step to the call (`DecodeCall.run`: three lists of integers, the argmax computed in C beside the logits;
the eighteenth pass) and as it did before (`prepare_inputs` and Day 12's metadata as tensors, then `DecodeCall.__call__`, then
`rows_argmax`: the seventeenth pass), and as now but with Day 10's slot-table entry written by PyTorch's indexed assignment rather
than through NumPy, in alternating rounds of steps on one engine, sorted by the memory's phase.

    python bench/batch1_outside_call.py --rounds 100

One request of 128 random tokens on the default model in bfloat16, greedy, decoded on; each round begins with a sum over as many
bytes as the weights (the memory's rate then: bench/alternating.py's `alternate_by_phase`), then runs `--steps` engine steps with
each arm and times them whole and inside the C library (every call into it timed): the step, and what is left outside the call.
The seventeenth pass's path is the runner's own code with `run` answering None, which is what the runner did before it had `run`.
Writes OUT/batch1_outside_call.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, statistics, sys, time
from pathlib import Path
import torch
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.pull import resolve_model
from nanoserve.sampling import SamplingParams
from nanoserve.offline_bench import machine, sum_buffer
from nanoserve.weights import weight_bytes
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import alternate_by_phase, write_results

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--rounds', type=int, default=100); ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    need = 128 + 20 + 3 * (args.rounds + 2) * args.steps + 1    # the prompt, the warm-up and every timed step of 3 arms: the request never ends
    eng = build_engine(resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)), EngineConfig(dtype='bfloat16', max_batch_size=1, max_model_len=need),
                       batch=PersistentBatch)
    call = eng.runner.decode_call
    if call is None: sys.exit(f"the decode call does not apply here: {eng.runner.decode_call_off}")
    lib, inside = call.lib, [0.0]
    class Timed:                                   # the C library, every function timed
        def __getattr__(self, name):
            f = getattr(lib, name)
            def timed(*a):
                t = time.perf_counter(); r = f(*a); inside[0] += time.perf_counter() - t; return r
            return timed
    call.lib = Timed()
    run, numpy_view = call.run, eng.cache._slots_np
    arms = {'rows (now)': (run, numpy_view), 'rows, slot via torch': (run, eng.cache.slots), 'metadata (17th pass)': (lambda *a, **k: None, numpy_view)}
    eng.add_request(torch.randint(3, 40000, (128,), generator=torch.Generator().manual_seed(0)).tolist(),
                    SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True))
    for _ in range(20): eng.step()
    outside = {a: [] for a in arms}
    def steps(a):
        def f():
            assert eng.has_unfinished(), 'the request ended: every step must be a decode'
            call.run, eng.cache._slots_np = arms[a]; inside[0] = 0.0
            t = time.perf_counter()
            for _ in range(args.steps): eng.step()
            outside[a].append(((time.perf_counter() - t) - inside[0]) / args.steps)
        return f
    nbytes = weight_bytes(eng.model); x = sum_buffer(nbytes)
    try: by_phase = alternate_by_phase({a: steps(a) for a in arms}, args.rounds, x.sum, nbytes)
    finally: call.run, eng.cache._slots_np = run, numpy_view
    assert call.run is run and eng.runner.decode_call is call and eng.cache._slots_np is numpy_view
    mach, rows = machine(), []
    allout = {a: 1e3 * statistics.median(v[1:]) for a, v in outside.items()}      # the first was the warm-up call
    for phase, (n, med) in by_phase.items():
        for a in arms:
            rows.append({'phase': phase, 'rounds': n, 'arm': a, 'steps_per_round': args.steps, 'step_ms_median': round(med[a] / args.steps, 4),
                         'outside_call_ms_median_all_rounds': round(allout[a], 4), 'machine': mach})
    lines = [f"machine: {mach}; bfloat16, batch 1, contexts from 148 tokens on; {args.rounds} alternating rounds of {args.steps} steps per arm, "
             f"each begun by a sum over the weights' bytes",
             f"{'phase':6s}{'rounds':>7}  {'arm':22s}{'step ms (median)':>18}{'outside the call ms (all rounds)':>34}"]
    lines += [f"{r['phase']:6s}{r['rounds']:>7}  {r['arm']:22s}{r['step_ms_median']:>18.3f}{r['outside_call_ms_median_all_rounds']:>34.3f}" for r in rows]
    write_results(args.out, 'batch1_outside_call', rows, lines)

if __name__ == '__main__': main()
