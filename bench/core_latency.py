#!/usr/bin/env python
"""The VM's two faces, a second at a time: the memory's read rate (a sum on both threads over as many bytes as the default model's
bfloat16 weights) and the time a cache line takes to go from one core to the other and back (two threads, each pinned to its
core, passing a counter through one shared line: a round trip is a write seen by the other core and its answer seen back).

    python bench/core_latency.py --seconds 120

On the fifteenth to seventeenth passes' Zen 4 VM the memory reads at about 33 GB/s or about 55 GB/s, switching every few seconds;
this shows whether the line's round trip switches with it (two cores on one die share a cache; on two dies, each brings its own
path to memory but a line between them crosses the package). Writes OUT/core_latency.{csv,txt} with the machine line: one row a
reading, and each phase's medians. Not part of CI.
"""
import argparse, ctypes, os, statistics, sys, time
from pathlib import Path
import torch
from nanoserve.core import c_library
from nanoserve.offline_bench import sum_buffer, machine
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternating import write_results

PINGPONG_C = r'''
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
static volatile int64_t line[16] __attribute__((aligned(64)));     /* the counter, alone in its cache line */
static int64_t trips;
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static void *answer(void *cpu) {                                     /* the other core: each odd value it sees, it makes even */
    pin((int)(intptr_t)cpu);
    for (int64_t i = 1; i < 2 * trips; i += 2) { while (line[0] != i) ; line[0] = i + 1; }
    return 0;
}
/* ns per round trip of one cache line between cores a and b, over n trips; -1 if the thread could not start */
double round_trip_ns(int a, int b, int64_t n) {
    pthread_t t; struct timespec t0, t1;
    trips = n; line[0] = 0;
    if (pthread_create(&t, 0, answer, (void *)(intptr_t)b)) return -1;
    pin(a);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = 0; i < 2 * n; i += 2) { line[0] = i + 1; while (line[0] != i + 2) ; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(t, 0);
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n;
}
'''

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--seconds', type=float, default=120); ap.add_argument('--trips', type=int, default=100_000)
    ap.add_argument('--bytes', type=int, default=269_030_016, help="the sum's bytes (default: the default model's bfloat16 weights)")
    ap.add_argument('--slow-gbs', type=float, default=40.0); ap.add_argument('--fast-gbs', type=float, default=45.0)
    ap.add_argument('--out', default='bench/results')
    args = ap.parse_args()
    lib = c_library('pingpong', PINGPONG_C, ('-O2', '-fPIC', '-shared', '-pthread'), ('-pthread',))
    lib.round_trip_ns.restype, lib.round_trip_ns.argtypes = ctypes.c_double, [ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2: sys.exit('needs two cores')
    torch.set_num_threads(2)
    x, mach, rows = sum_buffer(args.bytes), machine(), []
    x.sum(); t_end = time.time() + args.seconds
    while time.time() < t_end:
        t = time.perf_counter(); x.sum(); x.sum(); gbs = 2 * args.bytes / (time.perf_counter() - t) / 1e9
        ns = lib.round_trip_ns(cpus[0], cpus[1], args.trips)
        if ns < 0: sys.exit('could not start the second thread')
        os.sched_setaffinity(0, cpus)                                 # the pin moved this thread to one core: give it both back
        rows.append({'t_s': round(args.seconds - (t_end - time.time()), 2), 'sum_gbs': round(gbs, 2), 'round_trip_ns': round(ns, 1), 'machine': mach})
    lines = [f"machine: {mach}; {len(rows)} readings over {args.seconds:g} s: a sum over {args.bytes / 1e6:.0f} MB on two threads, then "
             f"{args.trips:,} round trips of one cache line between cores {cpus[0]} and {cpus[1]}",
             f"{'phase':6s}{'readings':>9}{'sum GB/s':>10}{'round trip ns':>15}"]
    for phase, keep in (('slow', lambda g: g < args.slow_gbs), ('fast', lambda g: g > args.fast_gbs)):
        rs = [r for r in rows if keep(r['sum_gbs'])]
        if rs: lines.append(f"{phase:6s}{len(rs):>9}{statistics.median(r['sum_gbs'] for r in rs):>10.1f}{statistics.median(r['round_trip_ns'] for r in rs):>15.1f}")
    write_results(args.out, 'core_latency', rows, lines)

if __name__ == '__main__': main()
