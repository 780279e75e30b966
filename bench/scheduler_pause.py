#!/usr/bin/env python
"""Day 16's `--waiting-served-ratio` through the server: `nanoserve serve` with the default budgets and with the ratio (TGI's rule:
a step whose waiting requests are at least the ratio times the decoding ones gets the whole budget), the side-by-side bench's
plans (32 requests, 32-128 tokens in, 64 out), servers pinned to one core and the client on the other.

Two measurements, both through a server process whose model runner logs every step (prompt tokens, decodes, milliseconds) to a
file; nothing else in the server changes:

- `--trace`: one crowd through each arm, and the steps it ran as, to see where a crowd's prefill goes;
- the A/B (default): every arm up at once, each round a fresh plan, the crowd and an open rate on each arm in turn, the order
  rotated every round (the VM's speed drifts by up to 2x within a minute); medians and per-round ratios to the first arm.

Writes OUT/scheduler_pause.{csv,txt} (with --trace, scheduler_pause_trace.{csv,txt}) with the machine line. Not part of CI.

    python bench/scheduler_pause.py --trace
    python bench/scheduler_pause.py --rounds 6 --modes crowd,4
"""
import argparse, json, os, statistics, sys, tempfile, time
from contextlib import ExitStack
from pathlib import Path

# Both arms spelled out. The committed run (bench/results/archive/twelfth_pass/) was taken before the rule became the default, and there
# the first arm is called 'default' and ran with no flags: the same schedule as these flags give today.
ARMS = {'old defaults': '--waiting-served-ratio inf --max-num-batched-tokens 512',
        'ratio 1.2, budget 4096': '--waiting-served-ratio 1.2 --max-num-batched-tokens 4096'}

def serve_traced(argv):
    "`nanoserve serve argv` with ModelRunner.execute timed: one JSON line a step, [start, prompt tokens, decodes, ms], to $STEPLOG."
    import nanoserve.runner as R
    from nanoserve.cli import main
    log, orig = open(os.environ['STEPLOG'], 'a', buffering=1), R.ModelRunner.execute
    def execute(self, out):
        t = time.perf_counter(); r = orig(self, out)
        log.write(json.dumps([round(t, 4), sum(s.num_tokens for s in out.scheduled if s.num_tokens > 1),
                              sum(s.num_tokens == 1 for s in out.scheduled), round(1e3 * (time.perf_counter() - t), 1)]) + '\n')
        return r
    R.ModelRunner.execute = execute
    sys.exit(main(['serve', *argv]))

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--trace', action='store_true', help='one crowd per arm, its steps listed')
    p.add_argument('--rounds', type=int, default=6); p.add_argument('--modes', default='crowd,4', help='crowd and/or rates, e.g. crowd,4')
    p.add_argument('--server-cpus', default='1'); p.add_argument('--client-cpus', default='0')
    p.add_argument('--out', default='bench/results')
    a = p.parse_args()
    from nanoserve.loadgen import spawn_server, make_plan, run_plan
    from nanoserve.loadreport import LoadReport
    from nanoserve.pull import resolve_model
    from nanoserve.tokenizer import Tokenizer
    from nanoserve.offline_bench import machine, write_csv
    os.sched_setaffinity(0, {int(c) for c in a.client_cpus.split(',')})
    path = resolve_model(None, log=lambda m: print(m, file=sys.stderr)); name = Path(path).name; tok = Tokenizer.from_dir(path)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    logs, urls, rows, lines = {}, {}, [], [f"machine: {machine()}; servers on cpu {a.server_cpus} (OMP_NUM_THREADS=1), client on cpu {a.client_cpus}; bfloat16, max batch 32"]
    plan_of = lambda k: make_plan(32, (32, 128), 64, seed=100 + k, tokenizer=tok)
    with ExitStack() as st:
        for arm, flags in ARMS.items():
            logs[arm] = st.enter_context(tempfile.NamedTemporaryFile('w+', suffix='.jsonl'))
            cmd = [sys.executable, __file__, '--serve-traced', '--model', path, '--host', '127.0.0.1', '--port', '0', '--served-model-name', name,
                   '--max-batch-size', '32', '--dtype', 'bfloat16', *flags.split()]
            urls[arm], _ = st.enter_context(spawn_server(command=cmd, port=0, cpus=a.server_cpus, env={'OMP_NUM_THREADS': '1', 'STEPLOG': logs[arm].name}))
        for arm in ARMS: run_plan(make_plan(32, (32, 128), 64, seed=999, tokenizer=tok).as_crowd(), urls[arm], name, 'crowd')   # warm-up
        if a.trace:
            trace = []
            for arm in ARMS:
                n0 = len(Path(logs[arm].name).read_text().splitlines())
                r = LoadReport.of(run_plan(plan_of(0).as_crowd(), urls[arm], name, 'crowd'))
                steps = [json.loads(l) for l in Path(logs[arm].name).read_text().splitlines()[n0:]]
                lines += ['', f"{arm} ({ARMS[arm]}): the crowd in {len(steps)} steps; out tok/s {r.output_throughput:.1f}, "
                          f"TPOT p50 {1e3 * r.tpot.p50:.0f} ms, ITL p99 {1e3 * r.itl.p99:.0f} ms, TTFT p50 {1e3 * r.ttft.p50:.0f} ms",
                          '  start ms  prompt tokens  decodes  step ms']
                lines += [f"  {1e3 * (s[0] - steps[0][0]):8.0f}  {s[1]:13d}  {s[2]:7d}  {s[3]:7.1f}" for s in steps if s[1]]
                trace += [dict(arm=arm, start_ms=round(1e3 * (s[0] - steps[0][0]), 1), prompt_tokens=s[1], decodes=s[2], step_ms=s[3], machine=machine()) for s in steps]
                dec = [s[3] for s in steps if not s[1]]
                lines.append(f"  and {len(dec)} steps of decodes alone, median {statistics.median(dec):.1f} ms")
            write_csv(trace, out/'scheduler_pause_trace.csv')
            stem = 'scheduler_pause_trace'
        else:
            labels, modes = list(ARMS), a.modes.split(',')
            for k in range(a.rounds):
                plan = plan_of(k)
                order = labels[k % 2:] + labels[:k % 2]
                for mode in modes:
                    pl = plan.as_crowd() if mode == 'crowd' else plan.at_rate(float(mode), seed=k)
                    for arm in order:
                        r = LoadReport.of(run_plan(pl, urls[arm], name, 'crowd' if mode == 'crowd' else 'open'))
                        rows.append(dict(round=k, mode=mode, arm=arm, out_tok_s=round(r.output_throughput, 1), tpot_p50_ms=round(1e3 * r.tpot.p50, 1),
                                         itl_p99_ms=round(1e3 * r.itl.p99, 1), ttft_p50_ms=round(1e3 * r.ttft.p50, 1), machine=machine()))
                        print(rows[-1], file=sys.stderr, flush=True)
            keys = ('out_tok_s', 'tpot_p50_ms', 'itl_p99_ms', 'ttft_p50_ms')
            lines += [f"{a.rounds} rounds, each a fresh plan (seed 100 + round), every mode on each arm in turn; the median of each metric, "
                      f"and in brackets the median over rounds of the arm's value / {labels[0]}'s"]
            for mode in modes:
                get = lambda k, arm, m: next(r[m] for r in rows if r['round'] == k and r['arm'] == arm and r['mode'] == mode)
                lines += ['', f"{mode if mode == 'crowd' else 'open ' + mode + '/s'}:", f"  {'arm':<24}" + ''.join(f"{m:>22}" for m in keys)]
                for arm in labels:
                    lines.append(f"  {arm:<24}" + ''.join(f"{statistics.median(get(k, arm, m) for k in range(a.rounds)):>13.1f} ({statistics.median(get(k, arm, m) / get(k, labels[0], m) for k in range(a.rounds)):.2f}x)"
                                                          for m in keys))
            write_csv(rows, out/'scheduler_pause.csv')
            stem = 'scheduler_pause'
    lines += ['', f"arms: " + '; '.join(f"{k}: {v}" for k, v in ARMS.items()), f"command: python bench/scheduler_pause.py {' '.join(sys.argv[1:])}".rstrip()]
    (out/f'{stem}.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__':
    if sys.argv[1:2] == ['--serve-traced']: serve_traced(sys.argv[2:])
    else: main()
