#!/usr/bin/env python
"""`nanoserve bench offline` of this checkout against another one, in alternating rounds: did a change cost speed?

    python bench/tree_ab.py --before OLD_CHECKOUT [--modes default,no-batch-invariant] [--rounds 4] [--name NAME]

Each round runs, for every mode, `nanoserve bench offline --dtypes bfloat16 --num-requests 32 --batch1-requests 4`
(32 prompts together, then 4 one at a time) once through each tree, the trees' order flipped every round, in one venv:
the other tree's package goes first on PYTHONPATH (its C kernels build from its own sources). Writes OUT/NAME.csv
(every run) and OUT/NAME.txt (medians after / before, per mode and batch) with the machine and the command."""
import argparse, csv, os, statistics, subprocess, sys, tempfile
from pathlib import Path
from nanoserve.offline_bench import machine

ROOT = Path(__file__).resolve().parents[1]
MODES = {'default': [], 'no-batch-invariant': ['--no-batch-invariant']}


def run(tree: Path, flags: list[str]) -> list[dict]:
    "One offline bench through `tree`'s nanoserve: its bfloat16 rows."
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / 'offline.csv'
        env = {**os.environ, 'PYTHONPATH': str(tree)}
        cmd = [str(Path(sys.executable).parent / 'nanoserve'), 'bench', 'offline', '--dtypes', 'bfloat16',
               '--num-requests', '32', '--batch1-requests', '4', '--csv', str(out), *flags]
        subprocess.run(cmd, check=True, env=env, cwd=d, capture_output=True, text=True)
        return [r for r in csv.DictReader(open(out)) if r.get('engine', 'nanoserve').startswith('nanoserve')]


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--before', type=Path, required=True, help='the other checkout (its repository root)')
    p.add_argument('--modes', default='default,no-batch-invariant')
    p.add_argument('--rounds', type=int, default=4)
    p.add_argument('--name', default='tree_ab')
    p.add_argument('--out', type=Path, default=ROOT / 'bench' / 'out')
    a = p.parse_args()
    trees = {'before': a.before.resolve(), 'after': ROOT}
    rows = []
    for r in range(a.rounds):
        for side in (['before', 'after'] if r % 2 == 0 else ['after', 'before']):
            for mode in a.modes.split(','):
                for x in run(trees[side], MODES[mode]):
                    rows.append(dict(round=r, side=side, mode=mode, batch=x['batch'],
                                     output_tok_s=round(float(x['output_tok_s']), 1)))
                    print(f"round {r} {side:<6} {mode:<19} batch {x['batch']:>2}: {x['output_tok_s']} tok/s",
                          flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / f'{a.name}.csv', 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], 'machine'])
        w.writeheader()
        w.writerows(r | {'machine': machine()} for r in rows)
    lines = [f"machine: {machine()}", f"command: python bench/tree_ab.py {' '.join(sys.argv[1:])}", '']
    for mode in a.modes.split(','):
        for batch in dict.fromkeys(r['batch'] for r in rows if r['mode'] == mode):
            side = {s: [r['output_tok_s'] for r in rows if (r['mode'], r['batch'], r['side']) == (mode, batch, s)]
                    for s in ('before', 'after')}
            b, af = statistics.median(side['before']), statistics.median(side['after'])
            lines.append(f"{mode:<19} batch {batch:>2}: before {side['before']} after {side['after']}  medians "
                         f"{b:.1f} -> {af:.1f} ({af / b:.3f}x)")
    (a.out / f'{a.name}.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
