#!/usr/bin/env python
"""Batch 1 with the product kernels' packed weights in Day 06's arena (one block on 2 MiB pages, in the order a step reads them)
against the same copies each in its own tensor on 4 KiB pages, through Day 13's decode call. In bfloat16 without AMX also with the
product kernel built as the fifteenth pass left it (`-DDOT_AHEAD_ONE_ROW=4096`: one-row passes prefetch 4 KB ahead, which over
huge pages reads slower), on the copies apart (the fifteenth pass as a whole) and on the arena. With
two sums over as many bytes as the weights: one on 4 KiB pages (the memory's rate as `bench offline` measured it before this pass)
and one on huge pages (as it measures it now). The arms alternate in every round; the rounds are then sorted by the 4 KiB sum's
rate, because this VM's memory switches between a slow and a fast level every few seconds.

    python bench/weight_arena.py --rounds 1500
    python bench/weight_arena.py --dtype float32

One request of 128 random tokens on the default model, prefilled; the two calls give the same logits (asserted). Writes
OUT/weight_arena.{csv,txt} with the machine line and the transparent-huge-page mode. Not part of CI.
"""
import argparse, ctypes, statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_step import decoding_engine
from decode_call_split import step_inputs
from nanoserve.arena import huge_buffer, huge_page_bytes, thp_mode
from nanoserve.decode_call import DecodeCall
from nanoserve.core import c_library
from nanoserve.fast import FastLinear, amx_pack, bf16_isa, AMX_LINEAR_C, AMX_LINEAR_FLAGS, _declare_amx
from nanoserve.f32_linear import f32_pack
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import write_csv, machine

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', default=None); ap.add_argument('--dtype', default='bfloat16'); ap.add_argument('--rounds', type=int, default=1500)
    ap.add_argument('--rows', type=int, default=1, help='decodes in the step (each a request of 128 random tokens)')
    ap.add_argument('--fast-gbs', type=float, default=42.0, help='a round whose 4 KiB sum reads faster than this is in the fast phase')
    ap.add_argument('--slow-gbs', type=float, default=36.0, help='and slower than this, in the slow phase')
    ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    path, mach = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)), machine()
    eng = decoding_engine(path, args.dtype, args.rows, 'fast', max_tokens=100_000)
    model, arena_call = eng.runner.model, eng.runner.decode_call
    if arena_call is None: sys.exit(f"the decode call does not apply here: {eng.runner.decode_call_off}")
    ids, meta = step_inputs(eng)
    name = 'amx' if args.dtype == 'bfloat16' else 'f32'
    mods = [m for m in model.modules() if isinstance(m, FastLinear) and getattr(m, name) is not None]
    arena = [getattr(m, name) for m in mods]
    own = [(amx_pack if name == 'amx' else f32_pack)(m.weight) for m in mods]         # each copy its own tensor, 4 KiB pages
    for m, t in zip(mods, own): setattr(m, name, t)
    own_call = DecodeCall(model, eng.runner.cache)
    for m, t in zip(mods, arena): setattr(m, name, t)
    prefetching = None                                                                  # the fifteenth pass's product kernel
    if name == 'amx' and bf16_isa() == 'avx512_bf16':
        lib = c_library('bf16_dot_linear_prefetch_one_row', AMX_LINEAR_C, AMX_LINEAR_FLAGS + ('-DNO_TILES', '-DDOT_AHEAD_ONE_ROW=4096'), declare=_declare_amx)
        prefetching = ctypes.cast(lib.amx_linear, ctypes.c_void_p).value
        arena_pf_call = DecodeCall(model, eng.runner.cache); arena_pf_call._kernels.linear = prefetching
        own_call._kernels.linear = prefetching
    nbytes = sum(t.numel() * t.element_size() for t in arena)
    small = torch.ones(nbytes // 4)
    huge = huge_buffer(nbytes).view(torch.float32); huge.fill_(1.0)
    huge_mib = (huge_page_bytes(arena[0]) or 0) >> 20, (huge_page_bytes(huge) or 0) >> 20
    arms = {'sum, 4 KiB pages': small.sum, 'sum, huge pages': huge.sum, 'apart, prefetch' if prefetching else 'copies apart': lambda: own_call(ids, meta)}
    if prefetching: arms['arena, prefetch'] = lambda: arena_pf_call(ids, meta)
    arms['arena'] = lambda: arena_call(ids, meta)
    rows = []
    with torch.inference_mode():
        assert torch.equal(own_call(ids, meta), arena_call(ids, meta))
        if prefetching: assert torch.equal(arena_pf_call(ids, meta), arena_call(ids, meta))
        for r in range(args.rounds):
            t = {}
            for k, f in (arms.items() if r % 2 == 0 else list(arms.items())[::-1]):
                t0 = time.perf_counter(); f(); t[k] = time.perf_counter() - t0
            rows.append(t)
    gbs = lambda s: nbytes / s / 1e9
    phases = {'slow': [r for r in rows if gbs(r['sum, 4 KiB pages']) < args.slow_gbs], 'fast': [r for r in rows if gbs(r['sum, 4 KiB pages']) > args.fast_gbs], 'all': rows}
    out_rows = []
    for ph, rs in phases.items():
        if not rs: continue
        med = {k: statistics.median(r[k] for r in rs) for k in arms}
        for k in arms:
            out_rows.append({'dtype': args.dtype, 'phase': ph, 'rounds': len(rs), 'arm': k, 'ms_median': round(1e3 * med[k], 3), 'gbs': round(gbs(med[k]), 1),
                             'share_of_huge_sum': round(med['sum, huge pages'] / med[k], 3), 'share_of_4k_sum': round(med['sum, 4 KiB pages'] / med[k], 3),
                             'thp': thp_mode(), 'machine': mach})
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    write_csv(out_rows, out/'weight_arena.csv')
    lines = [f"machine: {mach}; {args.dtype}; {args.rows} request(s) of 128 tokens, their decode call; {nbytes / 1e6:.0f} MB of packed weights; "
             f"transparent huge pages: {thp_mode()} (the arena: {huge_mib[0]} MiB on huge pages, the huge sum's buffer: {huge_mib[1]} MiB); "
             f"{args.rounds} alternating rounds, sorted by the 4 KiB sum's rate (slow < {args.slow_gbs:g} GB/s < {args.fast_gbs:g} < fast)",
             f"{'phase':5s} {'rounds':>6s}  {'arm':18s} {'ms (median)':>11s} {'GB/s':>6s} {'of huge sum':>11s} {'of 4 KiB sum':>12s}"]
    lines += [f"{r['phase']:5s} {r['rounds']:>6d}  {r['arm']:18s} {r['ms_median']:>11.2f} {r['gbs']:>6.1f} {r['share_of_huge_sum']:>11.0%} {r['share_of_4k_sum']:>12.0%}" for r in out_rows]
    lines.append('command: python bench/weight_arena.py ' + ' '.join(sys.argv[1:]))
    (out/'weight_arena.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
