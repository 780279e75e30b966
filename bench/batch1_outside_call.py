#!/usr/bin/env python
"""The part of a batch-1 decode step outside Day 13's C call (Python: scheduling, the call's own wrapper, sampling, detokenizing),
with the call's logits handed to the sampler in the model's dtype (the seventeenth pass) and widened to float32 first (as before),
in alternating rounds of steps on one engine.

    python bench/batch1_outside_call.py --rounds 100

One request of 128 random tokens on the default model in bfloat16, greedy, decoded on; each round runs `--steps` engine steps with
one arm and times them, minus the time inside the C call (timed around it): what is left is the step's work outside the call.
Writes OUT/batch1_outside_call.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, statistics, sys, time
from pathlib import Path
import torch
import nanoserve.decode_call as DC
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.batch import PersistentBatch
from nanoserve.pull import resolve_model
from nanoserve.sampling import SamplingParams
from nanoserve.offline_bench import machine
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import write_results

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--rounds', type=int, default=100); ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    need = 128 + 20 + 2 * args.rounds * args.steps + 1          # the prompt, the warm-up and every timed step: the request never ends
    eng = build_engine(resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)), EngineConfig(dtype='bfloat16', max_batch_size=1, max_model_len=need),
                       batch=PersistentBatch)
    call = eng.runner.decode_call
    if call is None: sys.exit(f"the decode call does not apply here: {eng.runner.decode_call_off}")
    lib, inside = call.lib, [0.0]
    class Timed:                                   # the C library, its decode_forward timed
        def __getattr__(self, name):
            f = getattr(lib, name)
            def timed(*a):
                t = time.perf_counter(); r = f(*a); inside[0] += time.perf_counter() - t; return r
            return timed
    call.lib = Timed()
    now = DC.DecodeCall.__call__
    def widened(self, ids, meta):                  # the sixteenth pass's: float32 logits out of the call
        r = now(self, ids, meta)
        return None if r is None else r.float()
    arms = {'model dtype (now)': now, 'float32 (sixteenth pass)': widened}
    eng.add_request(torch.randint(3, 40000, (128,), generator=torch.Generator().manual_seed(0)).tolist(),
                    SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True))
    for _ in range(20): eng.step()
    took = {a: [] for a in arms}
    try:
        for r in range(args.rounds):
            for a in (list(arms) if r % 2 else list(arms)[::-1]):
                assert eng.has_unfinished(), 'the request ended: every step must be a decode'
                DC.DecodeCall.__call__ = arms[a]; inside[0] = 0.0
                t = time.perf_counter()
                for _ in range(args.steps): eng.step()
                took[a].append(((time.perf_counter() - t) - inside[0]) / args.steps)
    finally: DC.DecodeCall.__call__ = now
    mach = machine()
    rows = [{'arm': a, 'rounds': args.rounds, 'steps_per_round': args.steps, 'outside_call_ms_median': round(1e3 * statistics.median(v), 4),
             'outside_call_ms_mean': round(1e3 * statistics.fmean(v), 4), 'machine': mach} for a, v in took.items()]
    lines = [f"machine: {mach}; bfloat16, batch 1, contexts from 148 tokens on; {args.rounds} alternating rounds of {args.steps} steps",
             f"{'logits out of the call':28s}{'ms outside the call (median)':>30}{'(mean)':>9}"]
    lines += [f"{r['arm']:28s}{r['outside_call_ms_median']:>30.3f}{r['outside_call_ms_mean']:>9.3f}" for r in rows]
    write_results(args.out, 'batch1_outside_call', rows, lines)

if __name__ == '__main__': main()
