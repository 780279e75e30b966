#!/usr/bin/env python
"""What Python costs right after a decode call: a batch-1 step's own host work, timed first just after Day 13's call has streamed
the weights (269 MB in bfloat16) through the caches, then again at once, then a third time (warm), in rounds on one engine.

    python bench/cold_after_call.py --rounds 200

The pieces: `build_metadata` (the seventeenth pass's tensors for one decode), `rows_argmax` on the call's logits (Day 14, through
its C kernel), and one `torch.empty` of the logits' shape. Writes OUT/cold_after_call.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, statistics, sys, time
from pathlib import Path
import torch
from nanoserve.attention import SeqChunk, build_metadata
from nanoserve.sampling import rows_argmax
from nanoserve.offline_bench import machine
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import write_results
from batch1_context import one_row_engine
from decode_call_split import step_inputs
from nanoserve.pull import resolve_model

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--rounds', type=int, default=200); ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    eng = one_row_engine(resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)), 'bfloat16', 128)
    call = eng.runner.decode_call
    if call is None: sys.exit(f"the decode call does not apply here: {eng.runner.decode_call_off}")
    ids, meta = step_inputs(eng)
    chunks, vocab = meta.chunks, eng.model.config.vocab_size
    pieces = {'build_metadata (one decode)': lambda logits: build_metadata(chunks, eng.cache),
              'rows_argmax (one row)': lambda logits: rows_argmax(logits),
              'torch.empty (the logits)': lambda logits: torch.empty(1, vocab, dtype=torch.bfloat16)}
    took = {(p, k): [] for p in pieces for k in ('first', 'second', 'third')}
    with torch.inference_mode():
        for r in range(args.rounds):
            for p, f in pieces.items():                           # each piece gets its own call before it: each first run is cold
                logits = call(ids, meta)
                for k in ('first', 'second', 'third'):
                    t = time.perf_counter(); f(logits); took[(p, k)].append(time.perf_counter() - t)
    mach = machine()
    rows = [{'piece': p, 'run': k, 'rounds': args.rounds, 'us_median': round(1e6 * statistics.median(v), 1), 'machine': mach} for (p, k), v in took.items()]
    lines = [f"machine: {mach}; bfloat16, the default model's decode call at one row (128 tokens of context), then each piece three times; "
             f"{args.rounds} rounds, medians in microseconds",
             f"{'piece':30s}{'just after the call':>21}{'again':>8}{'a third time':>14}"]
    for p in pieces:
        m = {r['run']: r['us_median'] for r in rows if r['piece'] == p}
        lines.append(f"{p:30s}{m['first']:>21.1f}{m['second']:>8.1f}{m['third']:>14.1f}")
    write_results(args.out, 'cold_after_call', rows, lines)

if __name__ == '__main__': main()
