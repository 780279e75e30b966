#!/usr/bin/env python
"""A served decode step runs on the AsyncEngine's thread, not the main one: does that change its speed? Eager and `--cuda-graphs` engines of
the default model, the same 32-token prompt generating 32 tokens, alternately: built on the main thread and stepped on a second thread (how
Day 56 first served), built and stepped on the main thread, and built and stepped on one second thread (how `build_app` serves now).

    python bench/thread_step.py [--model DIR] [--rounds 6] [--csv bench/results/thread_step.csv]

The capture plan is warmed for one row (`--warm-rows 1`), the only bucket a lone request uses. Reports the median decode step (ms) per engine and thread, and a profile of where the replayed step's
time goes on each thread (Inductor's own kernels against the GEMMs it calls out to).
"""
import argparse, statistics, sys, threading, time
from torch.profiler import profile, ProfilerActivity
from nanoserve.pull import resolve_model
from nanoserve.launch import build_engine
from nanoserve.sampling import SamplingParams
from nanoserve.offline_bench import machine, write_csv

def decode_steps(eng, prompt, n=33) -> list[float]:
    eng.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    ts = []
    while eng.has_unfinished():
        t = time.perf_counter(); eng.step(); ts.append(time.perf_counter() - t)
    return ts[1:]                                     # the first step is the prefill

def profile_ms(eng, prompt) -> dict:
    "Self CPU ms of Inductor's compiled graphs and of aten::mm/addmm over one 16-token generation."
    with profile(activities=[ProfilerActivity.CPU]) as p: decode_steps(eng, prompt, 17)
    out = {'inductor_kernels_ms': 0.0, 'gemm_ms': 0.0}
    for e in p.key_averages():
        if e.key.startswith('## Call CompiledFxGraph'): out['inductor_kernels_ms'] += e.self_cpu_time_total / 1e3
        elif e.key in ('aten::mm', 'aten::addmm'): out['gemm_ms'] += e.self_cpu_time_total / 1e3
    return out

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--rounds', type=int, default=6)
    p.add_argument('--csv', default='bench/results/thread_step.csv')
    args = p.parse_args()
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr))
    build = lambda: {'eager': build_engine(path), 'capture': build_engine(path, bucket_decode=True, persist_inputs=True, capture_decode=True, warm_rows=1)}
    prompt, rows = list(range(100, 132)), []
    def run(where, engines):
        steps = {k: [] for k in engines}
        for _ in range(args.rounds):
            for name, eng in engines.items(): steps[name] += decode_steps(eng, prompt)
        prof = profile_ms(engines['capture'], prompt)
        for name, ts in steps.items():
            rows.append({'arm': where, 'engine': name, 'step_ms_p50': round(1e3 * statistics.median(ts), 2), 'steps': len(ts),
                         **(prof if name == 'capture' else {'inductor_kernels_ms': '', 'gemm_ms': ''}), 'machine': machine()})
    def on_a_thread(fn):
        th = threading.Thread(target=fn); th.start(); th.join()
    on_a_thread(lambda: run('built and stepped on one second thread', build()))
    engines = build()
    on_a_thread(lambda: run('built on main, stepped on a second thread', engines))
    run('built and stepped on main', engines)
    write_csv(rows, args.csv)
    print(f"machine: {machine()}")
    print(f"{'arm':<42}{'engine':<9}{'step ms p50':>12}{'inductor ms':>13}{'gemm ms':>9}")
    for r in rows: print(f"{r['arm']:<42}{r['engine']:<9}{r['step_ms_p50']:>12.1f}{str(r['inductor_kernels_ms'] and round(r['inductor_kernels_ms'])):>13}{str(r['gemm_ms'] and round(r['gemm_ms'])):>9}")
    print(f"wrote {args.csv}")

if __name__ == '__main__':
    main()
