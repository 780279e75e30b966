#!/usr/bin/env python
"""The most any server could show against the peer at each rate of side-by-side runs already saved.

    python bench/peers/rate_ceiling.py bench/results/archive/*/peers* --out bench/results

An open-loop run's duration counts from its start and cannot end before its last request is sent, so its output throughput
is at most its tokens over the time of its last send (Day 41's `throughput_ceiling`). Over the peer's measured throughput in the same round, that is
the largest ratio any server, however fast, could have reached against the peer on that plan (Day 41's `ceiling_ratio`).
Reads DIR/<server>.roundK.runs.jsonl (or DIR/<server>.runs.jsonl for one round) of every DIR given; writes OUT/rate_ceiling.{csv,txt}.
"""
import argparse, csv, sys
from pathlib import Path
from nanoserve.servebench import load_runs
from nanoserve.loadreport import LoadReport, ceiling_ratio

def machine_of(d: Path) -> str:
    "The machine line of a side-by-side directory's text, else ''."
    t = d/'side_by_side.txt'
    return t.read_text().splitlines()[0].removeprefix('machine: ') if t.exists() else ''

def rows_of(d: Path, ours: str = 'nanoserve', peer: str = 'vllm') -> list[dict]:
    "One row per round and open-loop rate of a side-by-side directory: both throughputs, their ratio, and the ceiling's ratio."
    files = sorted(d.glob(f'{ours}.round*.runs.jsonl')) or sorted(d.glob(f'{ours}.runs.jsonl'))
    rows = []
    for f in files:
        g = f.with_name(f.name.replace(ours, peer, 1))
        if not g.exists(): continue
        k = f.name.split('.round')[1].split('.')[0] if '.round' in f.name else '1'
        for a, b in zip(map(LoadReport.of, load_runs(f)), map(LoadReport.of, load_runs(g))):
            if (c := ceiling_ratio(a, b)) is None: continue     # a crowd has no bound (and ceiling_ratio refuses runs of two plans)
            rows.append({'dir': str(d), 'round': int(k), 'rate': a.rate, f'{ours}_out_tok_s': round(a.output_throughput, 2),
                         f'{peer}_out_tok_s': round(b.output_throughput, 2), 'ratio': round(a.output_throughput / b.output_throughput, 3),
                         'ceiling_ratio': round(c, 3), 'machine': machine_of(d)})
    return rows

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('dirs', nargs='+'); p.add_argument('--out', default='bench/results')
    args = p.parse_args()
    rows = [r for d in args.dirs for r in rows_of(Path(d))]
    if not rows: sys.exit('no side-by-side runs with both servers under ' + ' '.join(args.dirs))
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    with open(out/'rate_ceiling.csv', 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
    lines = ['dir  round  rate  ratio  ceiling_ratio']
    lines += [f"{r['dir']}  {r['round']}  {r['rate']:g}/s  {r['ratio']:.2f}x  {r['ceiling_ratio']:.2f}x" for r in rows]
    for rate in sorted({r['rate'] for r in rows}):
        cs = [r['ceiling_ratio'] for r in rows if r['rate'] == rate]
        lines.append(f"at {rate:g}/s: the ceiling's ratio over {len(cs)} runs is {min(cs):.2f}x to {max(cs):.2f}x")
    lines.append(f"command: python bench/peers/rate_ceiling.py {' '.join(sys.argv[1:])}")
    (out/'rate_ceiling.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines[-4:]))

if __name__ == '__main__': main()
