#!/usr/bin/env python
"""Where batch 1's decode call spends its time, operator by operator, at each of the VM memory's two levels: Day 13's loop built
again with a time-stamp counter read (rdtsc) after every operator, called in rounds beside a sum over as many bytes as the weights
(the memory's rate in that round) and beside the call as the engine builds it, the two interleaved.

    python bench/decode_call_stamps.py --rounds 1200
    python bench/decode_call_stamps.py --dtype float32 --context 1024

The stamped copy is the engine's C source with a counter read inserted after each operator, nothing else changed; its time is
within a few percent of the plain call's (both are printed). A round is in the fast phase when its sum reads faster than
--fast-gbs and in the slow one below --slow-gbs. Each operator's share is the mean, over the phase's rounds, of its counter ticks
over the call's; its milliseconds are that share of the phase's median stamped call. Each product's rate is its bytes (the packed
weights it reads, every layer together) over its time. One request of `context` random tokens on the default model, prefilled
(profile_step's engine). Writes OUT/decode_call_stamps.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_step import decoding_engine
from decode_call_split import step_inputs
from nanoserve.decode_call import DECODE_CALL_C, DECODE_CALL_FLAGS, _declare
from nanoserve.core import c_library
from nanoserve.offline_bench import sum_buffer, machine
from alternating import write_results
from nanoserve.weights import weight_bytes
from nanoserve.pull import resolve_model

# (a statement of the loop, exactly as in Day 13's source, and the operator whose time ends there)
STAMPS = (('kn->norm(h, E, L->input_norm, xn, R, E, m->eps);', 'input norm'),
          ('if ((rc = layer_product(kn, xn, L->qkv, L->qkv_bias, qkv, R, QKV, E, nthreads, 0))) break;', 'qkv product'),
          ('{ rc = 3; break; }', 'rotary'),
          ('                        nthreads);\n        if (rc) break;', 'K/V write + attention'),
          ('if ((rc = layer_product(kn, att, L->o, L->o_bias, y, R, E, QS, nthreads, 0))) break;', 'o product'),
          ('kn->norm(h, E, L->post_norm, xn, R, E, m->eps);', 'residual + post norm'),
          ('if ((rc = layer_product(kn, xn, L->gate_up, L->gate_up_bias, gu, R, 2 * I, E, nthreads, 0))) break;', 'gate_up product'),
          ('kn->silu_mul(gu, a, R, I);', 'SiLU x up'),
          ('if ((rc = layer_product(kn, a, L->down, L->down_bias, y, R, E, I, nthreads, 0))) break;', 'down product'),
          ('add_(kn, h, y, R * E);\n    }', 'residual'),
          ('kn->norm(h, E, m->final_norm, xn, R, E, m->eps);', 'final norm'),
          ('else rc = product(kn, xn, m->lm_head, m->lm_head_bias, logits, R, m->vocab, E, nthreads, 1);', 'LM head'))
OPERATORS = [op for _, op in STAMPS]

def stamped_source() -> str:
    """Day 13's loop with `STAMP(k)` after each statement of `STAMPS` (k its operator's index): ticks since the last stamp, summed per
    operator until read. A statement that ends a block gets its stamp inside it, before the closing brace."""
    src = DECODE_CALL_C.replace('#include <string.h>', '#include <string.h>\n#include <x86intrin.h>\nstatic uint64_t ticks[16], last;\n'
                                '#define STAMP(k) { uint64_t t_ = __rdtsc(); ticks[k] += t_ - last; last = t_; }\n'
                                'void read_ticks(uint64_t *o) { for (int i = 0; i < 16; i++) { o[i] = ticks[i]; ticks[i] = 0; } }', 1)
    for stmt, op in STAMPS:
        assert src.count(stmt) == 1, f"Day 13's source changed: {stmt!r} is not there once"
        stamp = f' STAMP({OPERATORS.index(op)})'
        src = src.replace(stmt, stmt[:-6] + stamp + stmt[-6:] if stmt.endswith('\n    }') else stmt + stamp)
    return src.replace('int rc = 0;', 'int rc = 0; last = __rdtsc();', 1)

def main():
    import ctypes
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--dtype', default='bfloat16'); ap.add_argument('--context', type=int, default=128)
    ap.add_argument('--rounds', type=int, default=1200)
    ap.add_argument('--fast-gbs', type=float, default=45.0); ap.add_argument('--slow-gbs', type=float, default=40.0)
    ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    lib = c_library('decode_call_stamped', stamped_source(), DECODE_CALL_FLAGS, declare=_declare)
    lib.read_ticks.restype, lib.read_ticks.argtypes = None, [ctypes.c_void_p]
    eng = decoding_engine(resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)), args.dtype, 1, 'fast',
                          context=args.context, max_tokens=100_000, max_model_len=max(1024, args.context + 256))
    call = eng.runner.decode_call
    if call is None: sys.exit(f"the decode call does not apply here: {eng.runner.decode_call_off}")
    ids, meta = step_inputs(eng)
    plain_lib, nbytes, mach = call.lib, weight_bytes(eng.model), machine()
    x, buf = sum_buffer(nbytes), (ctypes.c_uint64 * 16)()
    with torch.inference_mode():
        want = call(ids, meta).clone(); call.lib = lib
        assert torch.equal(call(ids, meta), want)                          # the stamps change no result
        lib.read_ticks(buf); x.sum()
        rounds = []
        for r in range(args.rounds):
            t = time.perf_counter(); x.sum(); gbs = nbytes / (time.perf_counter() - t) / 1e9
            times = {}
            for arm, l in ((('plain', plain_lib), ('stamped', lib)) if r % 2 else (('stamped', lib), ('plain', plain_lib))):
                call.lib = l; t = time.perf_counter(); call(ids, meta); times[arm] = time.perf_counter() - t
            lib.read_ticks(buf); rounds.append((gbs, times, list(buf)[:len(OPERATORS)]))
        call.lib = plain_lib
    copy = 'amx' if args.dtype == 'bfloat16' else 'f32'
    layers = eng.model.model.layers
    product_bytes = {'qkv product': sum(getattr(l.self_attn.qkv_proj, copy).nbytes for l in layers),
                     'o product': sum(getattr(l.self_attn.o_proj, copy).nbytes for l in layers),
                     'gate_up product': sum(getattr(l.mlp.gate_up_proj, copy).nbytes for l in layers),
                     'down product': sum(getattr(l.mlp.down_proj, copy).nbytes for l in layers), 'LM head': getattr(eng.model.lm_head, copy).nbytes}
    rows, lines = [], []
    for phase, keep in (('slow', lambda g: g < args.slow_gbs), ('fast', lambda g: g > args.fast_gbs)):
        rs = [r for r in rounds if keep(r[0])]
        if not rs: continue
        gbs, plain, stamped = (statistics.median(v) for v in zip(*[(g, t['plain'], t['stamped']) for g, t, _ in rs]))
        lines.append(f"{phase} phase: {len(rs)} rounds, sum {gbs:.1f} GB/s ({nbytes / gbs / 1e6:.2f} ms for the weights' {nbytes / 1e6:.0f} MB); "
                     f"plain call {plain * 1e3:.2f} ms ({nbytes / gbs / 1e9 / plain:.0%} of the sum's rate), stamped {stamped * 1e3:.2f} ms")
        lines.append(f"  {'operator':<24}{'ms':>8}{'share':>8}{'GB/s':>8}{'of sum':>8}")
        for i, op in enumerate(OPERATORS):
            share = statistics.fmean(tk[i] / sum(tk) for _, _, tk in rs)
            ms = share * stamped * 1e3
            rate = product_bytes[op] / ms / 1e6 if op in product_bytes else None
            rows.append({'dtype': args.dtype, 'context': args.context, 'phase': phase, 'rounds': len(rs), 'sum_gbs': round(gbs, 2),
                         'plain_call_ms': round(plain * 1e3, 3), 'stamped_call_ms': round(stamped * 1e3, 3), 'operator': op,
                         'ms': round(ms, 4), 'share': round(share, 4), 'gbs': None if rate is None else round(rate, 2), 'machine': mach})
            lines.append(f"  {op:<24}{ms:>8.3f}{share:>8.1%}" + ('' if rate is None else f"{rate:>8.1f}{rate / gbs:>8.0%}"))
    write_results(args.out, 'decode_call_stamps', rows,
                  [f"machine: {mach}; {args.dtype}; one request of {args.context} tokens, its decode call; {args.rounds} rounds", *lines])

if __name__ == '__main__': main()
