#!/usr/bin/env python
"""A crowd's first tokens against the whole step's token budget, through the server, budgets in turn.

    python bench/crowd_budget.py                          # budgets 4096,1024,512,256, 3 rounds
    python bench/crowd_budget.py --budgets 4096,512 --rounds 5

Each run is `nanoserve bench serve` on the side by side's crowd (32 requests of 32-128 prompt tokens, 64 tokens out,
ignore_eos, all at t=0) against a fresh `nanoserve serve --max-num-batched-tokens B` pinned to --server-cpus, the
client on --client-cpus. Each round runs every budget once, the order flipped each round, so the VM's drift falls on
all alike. Writes OUT/crowd_budget.csv (every run) and OUT/crowd_budget.txt (the machine, the command, medians).
"""
import argparse, csv, os, statistics, subprocess, sys, tempfile
from pathlib import Path
from nanoserve.offline_bench import machine

METRICS = ('output_throughput', 'ttft_p50_ms', 'ttft_p99_ms', 'tpot_p50_ms', 'itl_p99_ms')


def run(budget: int, args, label: str) -> dict:
    "One crowd against a fresh server with this budget: the bench's CSV row."
    out = Path(tempfile.mkdtemp(prefix='crowd-'))
    cmd = ['taskset', '-c', args.client_cpus, str(Path(sys.executable).parent/'nanoserve'), 'bench', 'serve',
           '--rates', '', '--num-requests', '32', '--cpus', args.server_cpus, '--name', label, '--out', str(out),
           '--serve-args', f'--max-num-batched-tokens {budget} {args.serve_args}'.strip()]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    with (out/f'{label}.csv').open() as f: return next(csv.DictReader(f))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--budgets', default='4096,1024,512,256')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--server-cpus', default='1')
    p.add_argument('--client-cpus', default='0')
    p.add_argument('--serve-args', default='', help='more flags for nanoserve serve')
    p.add_argument('--out', default='bench/results/crowd_budget')
    args = p.parse_args()
    budgets, rows = [int(b) for b in args.budgets.split(',')], []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(args.rounds):
        for b in (budgets if k % 2 == 0 else budgets[::-1]):
            r = run(b, args, f'b{b}-r{k + 1}')
            rows.append({'budget': b, 'round': k + 1, **{m: round(float(r[m]), 2) for m in METRICS},
                         'machine': machine()})
            print(f"round {k + 1}, budget {b}: " + ', '.join(f"{m} {rows[-1][m]}" for m in METRICS),
                  file=sys.stderr, flush=True)
    with (out/'crowd_budget.csv').open('w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"machine: {machine()}", f"command: python bench/crowd_budget.py {' '.join(sys.argv[1:])}".rstrip(),
             f"the crowd (32 x 32-128 tokens in, 64 out) through nanoserve serve on cpus {args.server_cpus}, client on "
             f"{args.client_cpus}; {args.rounds} rounds, budgets in turn, order flipped each round; medians", '',
             f"{'budget':>6} " + ' '.join(f"{m:>17}" for m in METRICS)]
    for b in budgets:
        med = {m: statistics.median(r[m] for r in rows if r['budget'] == b) for m in METRICS}
        lines.append(f"{b:>6} " + ' '.join(f"{med[m]:>17.1f}" for m in METRICS))
    text = '\n'.join(lines)
    (out/'crowd_budget.txt').write_text(text + '\n')
    print(text)


if __name__ == '__main__':
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    main()
