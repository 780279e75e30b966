#!/usr/bin/env python
"""The memory's read rate sampled over time: `bench offline`'s own probe (a half-second sum over a gigabyte, Day 24's `memory_bandwidth`)
taken N times, a second apart. On the fifteenth pass's VM it jumped between about 33 and about 50 GB/s every few seconds, which is why
`bench offline` also measures batch 1 against probes taken between its steps (`paired_bandwidth_share`). Writes OUT/bandwidth_drift.{csv,txt}
with the machine line. Not part of CI.

    python bench/bandwidth_drift.py --samples 60 --out bench/results
"""
import argparse, statistics, sys, time
from pathlib import Path
from nanoserve.offline_bench import memory_bandwidth, write_csv, machine

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--samples', type=int, default=60); p.add_argument('--gap', type=float, default=1.0); p.add_argument('--out', default='bench/results')
    a = p.parse_args()
    t0, rows = time.monotonic(), []
    for i in range(a.samples):
        gbs = memory_bandwidth() / 1e9
        rows.append({'t_s': round(time.monotonic() - t0, 2), 'gbs': round(gbs, 2), 'machine': machine()})
        time.sleep(a.gap)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out/'bandwidth_drift.csv')
    xs = [r['gbs'] for r in rows]
    text = '\n'.join([f"machine: {machine()}; {a.samples} readings of a half-second sum over 1 GiB, {a.gap:g} s apart",
                      'GB/s: ' + ' '.join(f'{x:.0f}' for x in xs),
                      f"min {min(xs):.1f}, median {statistics.median(xs):.1f}, max {max(xs):.1f} GB/s",
                      'command: python bench/bandwidth_drift.py ' + ' '.join(sys.argv[1:])])
    (out/'bandwidth_drift.txt').write_text(text + '\n'); print(text)

if __name__ == '__main__': main()
