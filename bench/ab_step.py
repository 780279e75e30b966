#!/usr/bin/env python
"""One decode step, before and after a change, measured side by side: `bench/profile_step.py`'s measurement run in turn
from two checkouts (the earlier one given with --before, e.g. a `git worktree` of the commit before the change), alternating,
so the VM's drift between runs falls on both sides alike.

    git worktree add /tmp/before <commit>
    OMP_NUM_THREADS=1 taskset -c 1 python bench/ab_step.py --before /tmp/before --rows 32,1 --repeats 2

Each measurement is a fresh process: the checkout's `nanoserve` first on its path, an engine built, `rows` requests with
128-token random prompts decoded past their prefill, 20 steps timed and 5 profiled (self CPU time grouped by operator, as
profile_step.py does). Writes OUT/ab_step.{csv,txt} with the machine line and both commits. Not part of CI.
"""
import argparse, json, os, subprocess, sys, statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2])
from profile_step import measure, resolve_model
torch.set_num_threads(int(sys.argv[6]))
row = measure(resolve_model('SmolLM2-135M-Instruct', lambda m: None), sys.argv[3], int(sys.argv[4]), sys.argv[5])
import nanoserve; row['nanoserve_from'] = nanoserve.__file__
print('RESULT', json.dumps(row))
"""

def commit(path: Path) -> str:
    return subprocess.run(['git', '-C', str(path), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip() or '?'

def run(checkout: Path, dtype: str, rows: int, arm: str, threads: int) -> dict:
    out = subprocess.run([sys.executable, '-c', CHILD, str(checkout), str(HERE), dtype, str(rows), arm, str(threads)],
                         capture_output=True, text=True, env=os.environ | {'PYTHONPATH': str(checkout)})
    lines = [l for l in out.stdout.splitlines() if l.startswith('RESULT ')]
    if not lines: raise SystemExit(f"the measurement from {checkout} failed:\n{out.stderr[-2000:]}")
    row = json.loads(lines[-1][7:])
    if not row['nanoserve_from'].startswith(str(checkout)): raise SystemExit(f"{checkout}'s run imported {row['nanoserve_from']}")
    return row

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--before', required=True, help='a checkout of the earlier commit'); ap.add_argument('--after', default=str(HERE.parent))
    ap.add_argument('--rows', default='32,1'); ap.add_argument('--dtype', default='bfloat16'); ap.add_argument('--arm', default='fast')
    ap.add_argument('--threads', type=int, default=int(os.environ.get('OMP_NUM_THREADS', 1))); ap.add_argument('--repeats', type=int, default=2)
    ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    sides = {'before': Path(args.before).resolve(), 'after': Path(args.after).resolve()}
    commits = {k: commit(p) for k, p in sides.items()}
    rows = []
    for n in [int(r) for r in args.rows.split(',')]:
        for rep in range(args.repeats):
            for side, path in sides.items():
                r = run(path, args.dtype, n, args.arm, args.threads)
                r |= {'side': side, 'commit': commits[side], 'repeat': rep}
                rows.append(r); print(side, commits[side], n, rep, r['step_ms_p50'], file=sys.stderr, flush=True)
    sys.path.insert(0, str(sides['after']))
    from nanoserve.offline_bench import write_csv
    out = Path(args.out); write_csv(rows, out/'ab_step.csv')
    groups = [k for k in rows[0] if k.endswith('_ms') and k != 'step_ms_p50']
    lines = [f"machine: {rows[0]['machine']}, {args.threads} thread(s); {args.dtype}, arm {args.arm}; before {commits['before']}, after {commits['after']}",
             f"{'side':<7}{'rows':>5}  {'step ms (median of ' + str(args.repeats) + ')':>24}  " + ''.join(f'{g[:-3]:>18}' for g in groups)]
    for n in [int(r) for r in args.rows.split(',')]:
        for side in sides:
            rs = [r for r in rows if r['side'] == side and r['rows'] == n]
            med = lambda k: statistics.median(float(r[k]) for r in rs)
            lines.append(f"{side:<7}{n:>5}  {med('step_ms_p50'):>24.1f}  " + ''.join(f'{med(g):>18.1f}' for g in groups))
    lines.append(f"command: python bench/ab_step.py {' '.join(sys.argv[1:])}")
    (out/'ab_step.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
