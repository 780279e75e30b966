#!/usr/bin/env python
"""nanoserve and a peer server on the same plan, on the same cores, in one run; both reports side by side.

    python bench/peers/side_by_side.py                       # nanoserve vs vLLM (CPU build), default model
    python bench/peers/side_by_side.py --server-cpus 0,1 --client-cpus 0,1

One server at a time: launch it pinned to --server-cpus (taskset), warm it up, run the plan as a crowd and open loop
at each rate, stop it; then the next. With --repeats N, N rounds of that, the servers in turn in each, so a noisy
machine's drift falls on both alike; the summary compares each server's median round per mode (and every round is
listed). The client (this process) is pinned to --client-cpus, by default the other core.

With --interleave, every server is booted once and stays up (all pinned to --server-cpus), and each round runs every mode
on every server in turn, the servers' order flipped from one round to the next: on a VM whose speed drifts over minutes,
a server's crowd and the other's are then seconds apart, not a whole server's run (some 100-200 s) apart. Before each run the
other servers are waited on until they are quiet (vLLM's threads keep spinning for a second or so after its last request),
and their CPU time during the run (their whole process sessions, read from /proc) is written beside the results, so a server
that burns CPU while idle, and slows the other, shows.
At each rate the text also gives the most any server could show against the peer on that plan (Day 41's `ceiling_ratio`: a run
cannot end before its last request is sent).
Writes OUT/plan.json, OUT/<server>[.roundK].{csv,png,runs.jsonl}, OUT/side_by_side.{csv,png,txt}. Not part of CI: vLLM
takes minutes to start and lives in its own venv (bench/peers/install_vllm.sh).

With --goodput ttft:1000,tpot:100 (vLLM's --goodput objectives, in ms), the goodput sweep instead: every server booted
once, as with --interleave, runs a --goodput-requests plan (64) as a crowd to warm up, then open loop at rates from
--goodput-start, doubled while at least --goodput-share (0.9) of the requests meet every objective (failed requests
count against it), up to --goodput-max-rate, then --goodput-bisect midpoints between the highest pass and the first
failure. Each rate runs a plan of its own (seeded by the rate: the same prompts for every server at that rate, and
none the warm-up or another rate sent), so no prompt meets a prefix cache, as in vLLM's own benchmark, which sends
fresh random prompts. The servers take their steps in turn, the order flipped each step, the others quiet first.
Reports each server's highest passing rate and their ratio; writes OUT/goodput.{csv,txt}, OUT/goodput.plan.json (the
warm-up's), OUT/goodput.plan.RATE.json and OUT/<server>.goodput.runs.jsonl.

    python bench/peers/side_by_side.py --goodput ttft:1000,tpot:100 --goodput-requests 64 --goodput-share 0.9
"""
import argparse, contextlib, csv, os, re, shlex, statistics, sys, time
from pathlib import Path
from nanoserve.loadgen import make_plan, spawn_server, free_port, nanoserve_command, parse_lengths
from nanoserve.loadreport import LoadReport, table, write_csv, plot_reports, ceiling_ratio, SLO, Goodput, RateSweep
from nanoserve.servebench import bench_serve, save_runs
from nanoserve.pull import resolve_model
from nanoserve.tokenizer import Tokenizer
from nanoserve.offline_bench import machine
from nanoserve.core import auto_dtype

HERE = Path(__file__).resolve().parent
TICK = os.sysconf('SC_CLK_TCK')

def session_cpu(port: int) -> float:
    "CPU seconds so far of every process in the session of the server that listens on `port` (spawn_server starts each in a session of its own)."
    stats, leader = {}, None
    for p in Path('/proc').iterdir():
        if not p.name.isdigit(): continue
        try: stat, argv = (p/'stat').read_text(), (p/'cmdline').read_bytes().split(b'\0')
        except OSError: continue
        f = stat[stat.rindex(')') + 2:].split()
        stats[int(p.name)] = (int(f[3]), (int(f[11]) + int(f[12])) / TICK)            # session id, utime + stime
        if str(port).encode() in argv and leader is None: leader = int(f[3])
    if leader is None: raise RuntimeError(f"no process of the server on port {port}")
    return sum(cpu for sid, cpu in stats.values() if sid == leader)

def settle(ports: list[int], window: float = 0.5, quiet: float = 0.02, timeout: float = 60.0) -> float:
    """Wait until the servers on `ports` use less than `quiet` CPU seconds in a `window` (a server may keep its threads spinning a
    while after its last request: vLLM's do, for a second or so); returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        before = sum(session_cpu(p) for p in ports); time.sleep(window)
        if sum(session_cpu(p) for p in ports) - before < quiet: break
    return time.monotonic() - t0

def boot_all(stack, args, table_, names):
    "Boot every server of `names` inside `stack`, all pinned to --server-cpus; returns (urls, ports, boot seconds)."
    urls, ports, boots = {}, {}, {}
    for server in names:
        command, env = table_[server]
        ports[server] = port = free_port()
        print(f"[{server}] starting on cpus {args.server_cpus}", file=sys.stderr, flush=True)
        server_up = spawn_server(command=command(port), port=port, cpus=args.server_cpus, env=env,
                                 timeout=args.boot_timeout)
        urls[server], boots[server] = stack.enter_context(server_up)
        print(f"[{server}] healthy after {boots[server]:.0f} s", file=sys.stderr, flush=True)
    return urls, ports, boots

def run_interleaved(args, table_, names, name, plans, rates, out):
    """Every server booted once; rounds of every mode on every server in turn (the order flipped each round), round k on plans[k]:
    its prompts its own (seed + k), so that a round's crowd finds no earlier round's prompts in either server's prefix cache (within a round,
    the open-loop runs meet the crowd's prompts again, as in a round of fresh servers). Returns (rounds, boots, idle lines)."""
    rounds, boots, idle = [{} for _ in range(args.repeats)], {n: [] for n in names}, []
    with contextlib.ExitStack() as stack:
        urls, ports, booted = boot_all(stack, args, table_, names)
        for server in names: boots[server].append(booted[server])
        modes = [None] + rates
        for k in range(args.repeats):
            order = names if k % 2 == 0 else names[::-1]
            for rate in modes:
                for server in order:
                    others = [n for n in names if n != server]
                    waited = settle([ports[n] for n in others])
                    before = {n: session_cpu(ports[n]) for n in others}
                    run = bench_serve(urls[server], name, plans[k], [] if rate is None else [rate], crowd=rate is None,
                                      label=f'{server} r{k + 1}', seed=args.seed, log=lambda m: print(m, file=sys.stderr, flush=True))
                    rounds[k].setdefault(server, []).extend(run)
                    idle += [f"round {k + 1}, {server} {'crowd' if rate is None else f'open {rate:g}/s'} ({run[0].duration:.1f} s): {n} idle used "
                             f"{session_cpu(ports[n]) - before[n]:.2f} CPU s (quiet after {waited:.1f} s)" for n in others]
        for k in range(args.repeats):
            for server in names:
                save_runs(rounds[k][server], out, f'{server}.round{k + 1}', f'{server}: {name} {args.dtype}, server cpus {args.server_cpus}, round {k + 1} (interleaved)')
    return rounds, boots, idle

def log(m: str):
    print(m, file=sys.stderr, flush=True)

def sweep_goodput(args, table_, names, name, plan, plan_at, slo):
    """Every server booted once and warmed by a crowd of `plan`; then each server's `RateSweep` a step at a time, the
    servers in turn (the order flipped each step, the others quiet first). Returns (sweeps, runs, boots, idle lines)."""
    sweeps = {n: RateSweep(args.goodput_start, args.goodput_max_rate, args.goodput_bisect, args.goodput_share)
              for n in names}
    runs, idle = {n: [] for n in names}, []
    with contextlib.ExitStack() as stack:
        urls, ports, boots = boot_all(stack, args, table_, names)
        for server in names:
            settle([ports[n] for n in names if n != server])
            bench_serve(urls[server], name, plan, [], crowd=True, label=f'{server} warm', seed=args.seed, log=log)
        step = 0
        while pending := [n for n in names if sweeps[n].next_rate() is not None]:
            for server in (pending if step % 2 == 0 else pending[::-1]):
                rate = sweeps[server].next_rate()
                others = [n for n in names if n != server]
                waited = settle([ports[n] for n in others])
                before = {n: session_cpu(ports[n]) for n in others}
                run = bench_serve(urls[server], name, plan_at(rate), [rate], crowd=False, label=server, seed=args.seed,
                                  log=log)[0]
                g = Goodput.of(run.records, run.duration, slo)
                sweeps[server].shares[rate] = g.share
                runs[server].append(run)
                log(f"{server} {rate:g}/s: {g.good}/{g.num_requests} good ({g.share:.0%}), {g.per_s:.2f} good req/s: "
                    + ('pass' if sweeps[server].passed(rate) else 'fail'))
                idle += [f"{server} open {rate:g}/s ({run.duration:.1f} s): {n} idle used "
                         f"{session_cpu(ports[n]) - before[n]:.2f} CPU s (quiet after {waited:.1f} s)" for n in others]
            step += 1
    return sweeps, runs, boots, idle

def goodput_rows(server: str, sweep: RateSweep, runs, slo: SLO, extra: dict) -> list[dict]:
    "One CSV row per run of a server's sweep."
    rows = []
    for run in runs:
        g, rep = Goodput.of(run.records, run.duration, slo), LoadReport.of(run)
        hit = rep.prefix_cache_hit_rate
        rows.append({'server': server, 'rate': run.plan.rate, 'passed': sweep.passed(run.plan.rate),
                     'share': round(g.share, 4), 'good': g.good, 'num_requests': g.num_requests,
                     'failed': rep.failed, 'goodput_rps': round(g.per_s, 4),
                     'output_throughput': round(rep.output_throughput, 2),
                     **{f'{m}_{q}_ms': round(1e3 * getattr(getattr(rep, m), q), 1)
                        for m in ('ttft', 'tpot') for q in ('p50', 'p99')},
                     'duration_s': round(run.duration, 2),
                     'prefix_cache_hit_rate': None if hit is None else round(hit, 4), **extra})
    return rows

def sweep_text(server: str, sweep: RateSweep, runs, slo: SLO) -> str:
    "A server's sweep in one line: each rate's share, then its highest passing rate."
    steps = []
    for run in runs:
        g = Goodput.of(run.records, run.duration, slo)
        steps.append(f"{run.plan.rate:g}/s {g.share:.0%} ({g.per_s:.2f} good req/s, "
                     f"{'pass' if sweep.passed(run.plan.rate) else 'fail'})")
    fails = [r for r in sweep.shares if not sweep.passed(r)]
    if sweep.best is None: best = f"none (down to {min(sweep.shares):g}/s)"
    elif sweep.capped: best = f"at least {sweep.best:g}/s (the sweep's bound)"
    else: best = f"{sweep.best:g}/s (the lowest failure {min(fails):g}/s)"
    return f"{server}: {'; '.join(steps)}; highest passing rate: {best}"

def ratio_text(names, sweeps) -> str:
    "The first server's highest passing rate over the second's, with what bounds it."
    (a, sa), (b, sb) = ((n, sweeps[n]) for n in names)
    if sb.best is None or sa.best is None:
        none = ' and '.join(n for n in names if sweeps[n].best is None)
        return f"highest passing rate {a}/{b}: none ({none} passed no rate)"
    bound = ('at least ' if sa.capped and not sb.capped else 'at most ' if sb.capped and not sa.capped else
             "unknown: both reached the sweep's bound, " if sa.capped else '')
    return f"highest passing rate {a}/{b}: {bound}{sa.best / sb.best:.2f}x ({sa.best:g} vs {sb.best:g} req/s)"

def goodput_main(args, table_, names, name, path, out):
    "--goodput: the sweep of every server on one plan; writes OUT/goodput.{csv,txt} and each server's runs."
    slo = SLO.parse(args.goodput)
    RateSweep(args.goodput_start, args.goodput_max_rate, args.goodput_bisect, args.goodput_share)    # refuse early
    plan = make_plan(args.goodput_requests, parse_lengths(args.input_len), parse_lengths(args.output_len),
                     seed=args.seed, tokenizer=Tokenizer.from_dir(path))
    plan.save(out/'goodput.plan.json')
    plans = {}
    def plan_at(rate: float):
        "The plan of a rate: the warm-up's lengths, prompts of a seed of its own (saved beside the warm-up's)."
        if rate not in plans:
            lengths = parse_lengths(args.input_len), parse_lengths(args.output_len)
            plans[rate] = make_plan(args.goodput_requests, *lengths, seed=args.seed + 1 + round(1000 * rate),
                                    tokenizer=Tokenizer.from_dir(path))
            plans[rate].save(out/f'goodput.plan.{rate:g}.json')
        return plans[rate]
    t0 = time.monotonic()
    sweeps, runs, boots, idle = sweep_goodput(args, table_, names, name, plan, plan_at, slo)
    mach = machine()
    extra = {'slo': args.goodput, 'min_share': args.goodput_share, 'machine': mach, 'server_cpus': args.server_cpus,
             'client_cpus': args.client_cpus, 'dtype': args.dtype, 'max_batch_size': args.max_batch_size}
    rows = [row for n in names for row in goodput_rows(n, sweeps[n], runs[n], slo, extra)]
    with (out/'goodput.csv').open('w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for n in names: (out/f'{n}.goodput.runs.jsonl').write_text(''.join(r.to_json() + '\n' for r in runs[n]))
    objectives = ', '.join(f"{k.upper()} <= {1e3 * v:g} ms" for k, v in vars(slo).items() if v is not None)
    lines = [f"machine: {mach}",
             f"plan: {plan.name} (fingerprint {plan.fingerprint}); server cpus {args.server_cpus}, client cpus "
             f"{args.client_cpus}, {args.dtype}, max batch {args.max_batch_size}, nanoserve flags: "
             f"{args.nanoserve_flags or 'none'}" + ''.join(f"; variant {v}" for v in args.variant),
             f"goodput: {objectives} (--goodput {args.goodput}); a rate passes when at least {args.goodput_share:.0%} "
             f"of the {len(plan)} requests meet every objective (failed requests count against it)",
             f"sweep: from {args.goodput_start:g}/s, doubled while it passes up to {args.goodput_max_rate:g}/s, then "
             f"{args.goodput_bisect} midpoints; both servers up, a step of each in turn (the order flipped each step), "
             f"after a warm-up crowd of the plan on each; each rate on fresh prompts of its own "
             f"(goodput.plan.RATE.json); {time.monotonic() - t0:.0f} s in all",
             'boot to healthy: ' + ', '.join(f"{n} {s:.0f} s" for n, s in boots.items()), '']
    lines += [sweep_text(n, sweeps[n], runs[n], slo) for n in names]
    if len(names) == 2: lines.append(ratio_text(names, sweeps))
    if idle: lines += ['', "the idle servers' CPU time during each run:"] + idle
    text = '\n'.join(lines)
    (out/'goodput.txt').write_text(text + '\n')
    print(text)

METRICS = ('out', 'tpot_p50', 'itl_p99', 'ttft_p50')

def metric(report: LoadReport, m: str) -> float:
    "Output tok/s ('out'), or a latency percentile in ms ('tpot_p50': the report's tpot.p50)."
    if m == 'out': return report.output_throughput
    dist, q = m.split('_')
    return 1e3 * getattr(getattr(report, dist), q)

def ceiling_text(a: LoadReport, b: LoadReport, peer: str) -> str:
    c = ceiling_ratio(a, b)
    return '' if c is None else f"; no server could show more than {c:.2f}x {peer} on this plan (its last send bounds the run)"

def servers(args, path, name, ncpu):
    "name -> (command builder of a port, extra env)."
    ours = lambda port: nanoserve_command(path, port, '--served-model-name', name, '--max-batch-size', str(args.max_batch_size),
                                          '--dtype', args.dtype, '--max-model-len', str(args.max_model_len), *args.nanoserve_flags.split())
    vllm = lambda port: ['bash', str(HERE/'serve_vllm.sh'), str(path), str(port), '--max-num-seqs', str(args.max_batch_size)]
    table = {'nanoserve': (ours, {'OMP_NUM_THREADS': str(ncpu)}),
             'vllm': (vllm, {'SERVED_NAME': name, 'DTYPE': args.dtype, 'MAX_MODEL_LEN': str(args.max_model_len)})}
    for variant in args.variant:
        label, sep, flags = variant.partition('=')
        if not sep or not re.fullmatch(r'[A-Za-z0-9_.-]+', label) or label in table:
            raise SystemExit(f"--variant {variant!r}: give NAME=FLAGS, NAME new and of letters, digits, '_', '.', '-'")
        if label not in args.servers.split(','): raise SystemExit(f"--variant {label}: list {label} in --servers too")
        table[label] = (lambda port, flags=flags: ours(port) + shlex.split(flags), {'OMP_NUM_THREADS': str(ncpu)})
    return table

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None, help='model directory (default: the pulled default model)')
    p.add_argument('--servers', default='nanoserve,vllm')
    p.add_argument('--variant', action='append', default=[], metavar='NAME=FLAGS',
                   help='another nanoserve server named NAME, with FLAGS after --nanoserve-flags; '
                        'list NAME in --servers')
    p.add_argument('--server-cpus', default='1'); p.add_argument('--client-cpus', default='0')
    p.add_argument('--num-requests', type=int, default=32)
    p.add_argument('--input-len', default='32:128'); p.add_argument('--output-len', default='64')
    p.add_argument('--rates', default='1,2,4'); p.add_argument('--seed', type=int, default=0)
    p.add_argument('--max-batch-size', type=int, default=32)
    p.add_argument('--max-model-len', type=int, default=2048)
    p.add_argument('--dtype', default=auto_dtype()[0], help="both servers' dtype (default: nanoserve's auto for this machine, %(default)s)")
    p.add_argument('--nanoserve-flags', default='', help='extra flags for nanoserve serve, e.g. "--cuda-graphs --warm-rows 4"')
    p.add_argument('--boot-timeout', type=float, default=900)
    p.add_argument('--repeats', type=int, default=1, help='rounds of every server in turn (default 1)')
    p.add_argument('--interleave', action='store_true', help='boot every server once and run each mode on them in turn, round after round')
    p.add_argument('--goodput', default=None, metavar='SLOS',
                   help="run the goodput sweep instead, with vLLM's objectives in ms, e.g. ttft:1000,tpot:100")
    p.add_argument('--goodput-requests', type=int, default=64, help="the sweep's plan size (default 64)")
    p.add_argument('--goodput-share', type=float, default=0.9,
                   help='share of requests within every objective that passes a rate (default 0.9)')
    p.add_argument('--goodput-start', type=float, default=1.0, help="the sweep's first rate, req/s (default 1)")
    p.add_argument('--goodput-max-rate', type=float, default=64.0,
                   help="the sweep's bound, req/s: a pass there ends it (default 64)")
    p.add_argument('--goodput-bisect', type=int, default=3,
                   help='midpoints tried between the highest pass and the first failure (default 3)')
    p.add_argument('--out', default='bench/results/peers')
    args = p.parse_args()
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(',')})
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr))
    name = Path(path).name
    ncpu = len(args.server_cpus.split(','))
    table_ = servers(args, path, name, ncpu)
    names = args.servers.split(',')
    if args.goodput: return goodput_main(args, table_, names, name, path, out)
    plan = make_plan(args.num_requests, parse_lengths(args.input_len), parse_lengths(args.output_len), seed=args.seed,
                     tokenizer=Tokenizer.from_dir(path))
    plan.save(out/'plan.json')
    rates = [float(r) for r in args.rates.split(',') if r]
    rounds, boots, idle = [], {n: [] for n in names}, []         # rounds[k][server] -> that round's runs (crowd, then each rate)
    if args.interleave:
        plans = [plan] + [make_plan(args.num_requests, parse_lengths(args.input_len), parse_lengths(args.output_len), seed=args.seed + k,
                                    tokenizer=Tokenizer.from_dir(path)) for k in range(1, args.repeats)]
        for k, pk in enumerate(plans[1:], 2): pk.save(out/f'plan.round{k}.json')
        rounds, boots, idle = run_interleaved(args, table_, names, name, plans, rates, out)
    for k in range(args.repeats if not args.interleave else 0):
        rounds.append({})
        for server in names:
            command, env = table_[server]
            port = free_port()
            t0 = time.monotonic()
            print(f"[{server}] round {k + 1}: starting on cpus {args.server_cpus}", file=sys.stderr, flush=True)
            with spawn_server(command=command(port), port=port, cpus=args.server_cpus, env=env, timeout=args.boot_timeout) as (url, boot):
                boots[server].append(boot)
                print(f"[{server}] healthy after {boot:.0f} s", file=sys.stderr, flush=True)
                rounds[k][server] = bench_serve(url, name, plan, rates, label=server if args.repeats == 1 else f'{server} r{k + 1}', seed=args.seed,
                                                log=lambda m: print(m, file=sys.stderr, flush=True))
            save_runs(rounds[k][server], out, server if args.repeats == 1 else f'{server}.round{k + 1}',
                      f'{server}: {name} {args.dtype}, server cpus {args.server_cpus}' + (f', round {k + 1}' if args.repeats > 1 else ''))
            print(f"[{server}] done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    reports = [LoadReport.of(r) for rnd in rounds for rs in rnd.values() for r in rs]
    mach = machine()
    write_csv(reports, out/'side_by_side.csv', {'machine': mach, 'server_cpus': args.server_cpus, 'client_cpus': args.client_cpus,
                                                 'dtype': args.dtype, 'max_batch_size': args.max_batch_size})
    import matplotlib; matplotlib.use('Agg')
    plot_reports(reports, out/'side_by_side.png', f'{name} {args.dtype}: {plan.name}; server on cpu {args.server_cpus}, client on cpu {args.client_cpus}')
    lines = [f"machine: {mach}", f"plan: {plan.name} (fingerprint {plan.fingerprint}); server cpus {args.server_cpus}, client cpus {args.client_cpus}, "
             f"{args.dtype}, max batch {args.max_batch_size}, nanoserve flags: {args.nanoserve_flags or 'none'}"
             + ''.join(f"; variant {v}" for v in args.variant) + f"; {args.repeats} round(s)"
             + (', interleaved (both servers up, each mode on each in turn, the order flipped every round; round K > 1 on its own plan, '
                'seed + K - 1, plan.roundK.json)' if args.interleave else ''),
             'boot to healthy: ' + ', '.join(f"{k} {', '.join(f'{v:.0f}' for v in vs)} s" for k, vs in boots.items()), '', table(reports), '']
    if len(names) != 2: lines.append(f"(no comparison lines: they compare two servers, and {len(names)} ran)")
    if len(names) == 2:
        mode = lambda r: f"{r.mode}{'' if r.plan.rate is None else f' {r.plan.rate:g}/s'}"
        for k, rnd in enumerate(rounds):
            a, b = rnd[names[0]], rnd[names[1]]
            for ra, rb in zip(a, b):
                same = sum(x == y for x, y in zip(ra.texts, rb.texts))
                pa, pb = LoadReport.of(ra), LoadReport.of(rb)
                lines.append(f"round {k + 1}, {mode(ra)}: identical texts {same}/{len(ra.texts)}; output tok/s {names[0]}/{names[1]} = "
                             f"{pa.output_throughput / pb.output_throughput:.2f}x ({pa.output_throughput:.1f} vs {pb.output_throughput:.1f}); "
                             f"TPOT p50 {1e3 * pa.tpot.p50:.0f} vs {1e3 * pb.tpot.p50:.0f} ms; ITL p99 {1e3 * pa.itl.p99:.0f} vs {1e3 * pb.itl.p99:.0f} ms; "
                             f"TTFT p50 {1e3 * pa.ttft.p50:.0f} vs {1e3 * pb.ttft.p50:.0f} ms" + ceiling_text(pa, pb, names[1]))
        if args.repeats > 1:
            lines += ['', f'medians over the {args.repeats} rounds:']
            for i, r0 in enumerate(rounds[0][names[0]]):
                med = {n: {m: statistics.median(metric(LoadReport.of(rnd[n][i]), m) for rnd in rounds) for m in METRICS} for n in names}
                a, b = med[names[0]], med[names[1]]
                caps = [ceiling_ratio(LoadReport.of(rnd[names[0]][i]), LoadReport.of(rnd[names[1]][i])) for rnd in rounds]
                lines.append(f"{mode(r0)}: output tok/s {a['out']:.1f} vs {b['out']:.1f} = {a['out'] / b['out']:.2f}x; TPOT p50 {a['tpot_p50']:.0f} vs "
                             f"{b['tpot_p50']:.0f} ms; ITL p99 {a['itl_p99']:.0f} vs {b['itl_p99']:.0f} ms; TTFT p50 {a['ttft_p50']:.0f} vs {b['ttft_p50']:.0f} ms"
                             + ('' if None in caps else f"; the most any server could show against {names[1]}: {statistics.median(caps):.2f}x (median of the rounds)"))
    if idle: lines += ['', "the idle servers' CPU time during each run:"] + idle
    text = '\n'.join(lines)
    (out/'side_by_side.txt').write_text(text + '\n')
    print(text)

if __name__ == '__main__':
    main()
