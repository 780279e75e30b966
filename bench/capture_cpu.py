#!/usr/bin/env python
"""Decode speed at every row bucket, engines side by side: eager against `--cuda-graphs` (does the capture pay on the
CPU?), or bfloat16 against its quantized modes.

    python bench/capture_cpu.py                        # bfloat16 and float32, rows 1..32, eager vs the default recorder
    python bench/capture_cpu.py --arms eager,recorded,compile --rounds 3
    python bench/capture_cpu.py --dtypes bfloat16 --arms eager,int8,int4 --rows 1,32 --name quant_speed

Each arm is an engine built as `nanoserve generate` builds it (`build_engine`, the default model, max batch 32,
max_model_len 256): `eager` without the capture, `recorded` with the three capture flags and the CPU's default
recorder (the decode call where the model takes it), `compile` with the compile recorder named, `int8` and `int4`
eager with the decoder layers quantized at load. All arms of a dtype are built once, in this one process, and, after a
first run each, each row bucket R is measured on every arm in turn, round after round, the arms' order flipped each
round, so the machine's drift falls on all alike. A measurement: R random-token prompts of 32 tokens, 64 greedy tokens
each (ignore_eos), submitted together; the median step time over the run is a pure-decode step at R rows (63 of its 64
steps are), and decode tok/s is R over it. Writes OUT/NAME.csv and OUT/NAME.txt (NAME: --name, default capture_cpu)
with the machine and the command.
"""
import argparse, statistics, sys
from pathlib import Path
from nanoserve.pull import resolve_model
from nanoserve.launch import build_engine
from nanoserve.offline_bench import make_workload, run_nanoserve, write_csv, machine

CAPTURE = dict(bucket_decode=True, persist_inputs=True, capture_decode=True)
ARMS = {'eager': {}, 'recorded': CAPTURE, 'compile': {**CAPTURE, 'capture_recorder': 'compile'},
        'int8': {'quantization': 'int8'}, 'int4': {'quantization': 'int4'}}


def med_of(results: list[dict], dtype: str, rows: int, arm: str) -> float:
    "The median decode tok/s of one arm at one row count over the rounds so far."
    return statistics.median(x['decode_tok_s'] for x in results
                             if (x['dtype'], x['rows'], x['arm']) == (dtype, rows, arm))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None, help='model directory (default: the pulled default model)')
    p.add_argument('--dtypes', default='bfloat16,float32')
    p.add_argument('--rows', default='1,2,4,8,16,32')
    p.add_argument('--arms', default='eager,recorded', help=f"of {', '.join(ARMS)}")
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--output-len', type=int, default=64)
    p.add_argument('--out', default='bench/results/capture_cpu')
    p.add_argument('--name', default='capture_cpu', help='stem of the output files')
    args = p.parse_args()
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_list, arms, results = [int(r) for r in args.rows.split(',')], args.arms.split(','), []
    for dtype in args.dtypes.split(','):
        engines = {}
        for arm in arms:
            engines[arm] = build_engine(path, dtype=dtype, max_batch_size=max(rows_list), max_model_len=256,
                                        prefix_cache=False, **ARMS[arm])
            rec = engines[arm].boot.recorder if engines[arm].boot else None
            # a first run, not measured: the kernels' first calls, the allocator's first pages
            run_nanoserve(engines[arm], make_workload(2, (32, 32), 8, engines[arm].model.config.vocab_size), arm)
            print(f"[{dtype}] {arm}: recorder {rec}", file=sys.stderr, flush=True)
        for R in rows_list:
            w = make_workload(R, (32, 32), args.output_len, engines[arms[0]].model.config.vocab_size, seed=R)
            for k in range(args.rounds):
                for arm in (arms if k % 2 == 0 else arms[::-1]):
                    r = run_nanoserve(engines[arm], w, arm)
                    results.append(dict(dtype=dtype, rows=R, arm=arm, round=k + 1,
                                        recorder=engines[arm].boot.recorder if engines[arm].boot else '',
                                        step_ms_p50=round(r.step_ms_p50, 3),
                                        decode_tok_s=round(R / r.step_ms_p50 * 1e3, 1),
                                        output_tok_s=round(r.output_tok_s, 1), machine=machine()))
            print(f"[{dtype}] rows {R}: " + ', '.join(
                f"{a} {med_of(results, dtype, R, a):.1f}"
                for a in arms) + ' decode tok/s', file=sys.stderr, flush=True)
        del engines
    write_csv(results, out/f'{args.name}.csv')
    lines = [f"machine: {machine()}", f"command: python bench/capture_cpu.py {' '.join(sys.argv[1:])}".rstrip(),
             f"{args.rounds} rounds, arms alternated (order flipped each round); decode tok/s = rows / median step "
             "time; medians of the rounds", '']
    head = f"{'dtype':9} {'rows':>4} " + ' '.join(f"{a:>10}" for a in arms) + ''.join(
        f" {a + '/eager':>16}" for a in arms if a != 'eager' and 'eager' in arms)
    lines.append(head)
    for dtype in args.dtypes.split(','):
        for R in rows_list:
            med = {a: med_of(results, dtype, R, a) for a in arms}
            ratios = ''.join(f" {med[a] / med['eager']:>15.2f}x" for a in arms if a != 'eager' and 'eager' in med)
            lines.append(f"{dtype:9} {R:>4} " + ' '.join(f"{med[a]:>10.1f}" for a in arms) + ratios)
    text = '\n'.join(lines)
    (out/f'{args.name}.txt').write_text(text + '\n')
    print(text)


if __name__ == '__main__':
    main()
