#!/usr/bin/env python
"""How much of a serving process's CPU goes to the front end (HTTP, JSON, SSE) and how much to the engine loop, under a crowd.

    python bench/frontend_share.py                          # default model, server pinned to cpu 1, client on cpu 0
    python bench/frontend_share.py --nanoserve-flags "--no-pack-weights"

Nothing in the server is instrumented: the server runs as `nanoserve serve`, and this script reads each of its threads'
CPU time (utime + stime, /proc/PID/task/TID/stat) just before and just after the plan runs. The engine loop is the thread
named `nanoserve-engine` (Day 30); with OMP_NUM_THREADS=1 every torch op runs on it, so its CPU time is the model, the
scheduler, sampling and detokenization. The rest of the process is the front end. Writes OUT/frontend_share.{csv,txt}.
"""
import argparse, csv, os, sys, time
from pathlib import Path
from nanoserve.loadgen import make_plan, spawn_server, free_port, nanoserve_command, parse_lengths, run_plan
from nanoserve.loadreport import LoadReport
from nanoserve.pull import resolve_model
from nanoserve.tokenizer import Tokenizer
from nanoserve.offline_bench import machine
from nanoserve.core import auto_dtype

TICK = os.sysconf('SC_CLK_TCK')

def server_pid(port: int) -> int:
    "The pid of the process whose command line asks for `--port port` (taskset execs, so it is the server itself)."
    for p in Path('/proc').iterdir():
        if not p.name.isdigit(): continue
        try: argv = (p/'cmdline').read_bytes().split(b'\0')
        except OSError: continue
        if b'--port' in argv and argv[argv.index(b'--port') + 1:][:1] == [str(port).encode()] and b'serve' in argv: return int(p.name)
    raise RuntimeError(f"no process serves port {port}")

def thread_cpu(pid: int) -> dict[tuple[int, str], float]:
    "(tid, name) -> CPU seconds so far, for every thread of pid."
    out = {}
    for t in Path(f'/proc/{pid}/task').iterdir():
        try: stat = (t/'stat').read_text()
        except OSError: continue
        name = stat[stat.index('(') + 1:stat.rindex(')')]
        fields = stat[stat.rindex(')') + 2:].split()
        out[(int(t.name), name)] = (int(fields[11]) + int(fields[12])) / TICK      # utime, stime
    return out

def share(before: dict, after: dict) -> dict[str, float]:
    "CPU seconds spent between two snapshots, grouped: engine loop, front end (the rest)."
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    engine = sum(v for (_, name), v in spent.items() if name.startswith('nanoserve-engi'))   # comm keeps 15 bytes (Day 30)
    if not engine: raise RuntimeError("no thread named nanoserve-engine spent CPU time: is the server nanoserve (Day 30 names its loop thread)?")
    return {'engine_cpu_s': engine, 'frontend_cpu_s': sum(spent.values()) - engine}

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None)
    p.add_argument('--server-cpus', default='1'); p.add_argument('--client-cpus', default='0')
    p.add_argument('--num-requests', type=int, default=32)
    p.add_argument('--input-len', default='32:128'); p.add_argument('--output-len', default='64')
    p.add_argument('--dtype', default=auto_dtype()[0]); p.add_argument('--max-batch-size', type=int, default=32)
    p.add_argument('--nanoserve-flags', default='')
    p.add_argument('--repeats', type=int, default=2)
    p.add_argument('--out', default='bench/results')
    args = p.parse_args()
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(',')})
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)); name = Path(path).name
    plan = make_plan(args.num_requests, parse_lengths(args.input_len), parse_lengths(args.output_len), seed=0, tokenizer=Tokenizer.from_dir(path))
    port = free_port()
    cmd = nanoserve_command(path, port, '--served-model-name', name, '--max-batch-size', str(args.max_batch_size), '--dtype', args.dtype,
                            *args.nanoserve_flags.split())
    threads = len(args.server_cpus.split(','))
    mach = machine().rsplit(',', 1)[0] + f", server {threads} thread(s) (OMP_NUM_THREADS) on cpu {args.server_cpus}"
    rows = []
    with spawn_server(command=cmd, port=port, cpus=args.server_cpus, env={'OMP_NUM_THREADS': str(threads)}) as (url, boot):
        pid = server_pid(port)
        run_plan(plan.as_crowd(), url, name, 'crowd')                     # warm-up: every shape the crowd meets
        for i in range(args.repeats):
            t0, before = time.monotonic(), thread_cpu(pid)
            run = run_plan(plan.as_crowd(), url, name, 'crowd')
            wall, after = time.monotonic() - t0, thread_cpu(pid)
            rep = LoadReport.of(run)
            s = share(before, after)
            rows.append({'repeat': i, 'wall_s': round(wall, 3), **{k: round(v, 3) for k, v in s.items()},
                         'frontend_share': round(s['frontend_cpu_s'] / (s['engine_cpu_s'] + s['frontend_cpu_s']), 4),
                         'busy_share': round((s['engine_cpu_s'] + s['frontend_cpu_s']) / wall, 4),
                         'completed': rep.completed,
                         'output_throughput': round(rep.output_throughput, 1), 'tpot_p50_ms': round(1e3 * rep.tpot.p50, 1),
                         'dtype': args.dtype, 'flags': args.nanoserve_flags, 'machine': mach, 'server_cpus': args.server_cpus})
            print(rows[-1], file=sys.stderr, flush=True)
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    stem = 'frontend_share'
    with open(out/f'{stem}.csv', 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
    lines = [f"machine: {mach}", f"plan: {plan.name}, crowd, server cpus {args.server_cpus}, {args.dtype}, flags: {args.nanoserve_flags or 'none'}",
             'repeat  wall s  engine cpu s  front-end cpu s  front-end share  busy  out tok/s  TPOT p50 ms']
    lines += [f"{r['repeat']:>6}  {r['wall_s']:6.2f}  {r['engine_cpu_s']:12.2f}  {r['frontend_cpu_s']:15.2f}  {r['frontend_share']:15.1%}  {r['busy_share']:4.0%}"
              f"  {r['output_throughput']:9.1f}  {r['tpot_p50_ms']:11.1f}" for r in rows]
    lines.append(f"command: python bench/frontend_share.py {' '.join(sys.argv[1:])}".rstrip())
    (out/f'{stem}.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__': main()
