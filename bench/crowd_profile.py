#!/usr/bin/env python
"""Where a crowd's wall time goes in a real `nanoserve serve`, against the arithmetic floor of the same crowd.

    python bench/crowd_profile.py --rounds 3 --out bench/results       # needs py-spy (pip install py-spy)

The server runs as in the side-by-side bench (pinned to --server-cpus with OMP_NUM_THREADS = its cores, the client on
--client-cpus). After a warm-up crowd, each round sends a fresh plan of the side-by-side's shape (seed + round, so no prompt is
in the prefix cache) as a crowd, while `py-spy record --nonblocking` samples every thread of the server. The engine thread's
samples are put in groups by the Python frames on their stack (the decode call; the prefill's products, attention and the rest of
its forward; the step's other work), the front end's are its samples outside `select`, and each group's seconds are its samples
over the sampling rate. Nothing in the server is instrumented.

The floor: the crowd's products (every layer's for each prompt token, and the LM head for each prompt's last token and every
decode) at this core's bfloat16 (or float32) peak, measured here by a loop of independent `vdpbf16ps` (or FMA) instructions,
per core. No engine that does this arithmetic with these instructions can run the crowd faster; attention, sampling and the front
end come on top. On a CPU with AMX the engine's bfloat16 products run on tiles, faster than this peak, so there no floor is given.
A step that holds prefill tokens counts as prefill, decodes beside them included (the crowd's prefill pauses its few decodes).
Writes OUT/crowd_profile.{csv,txt} with the machine line. Not part of CI.
"""
import argparse, csv, ctypes, os, shutil, statistics, subprocess, sys, time
from collections import Counter
from pathlib import Path
from nanoserve.loadgen import make_plan, spawn_server, free_port, nanoserve_command, parse_lengths, run_plan
from nanoserve.loadreport import LoadReport, output_tokens
from nanoserve.pull import resolve_model
from nanoserve.tokenizer import Tokenizer
from nanoserve.config import ModelConfig
from nanoserve.core import c_library, cpu_flags
from nanoserve.offline_bench import machine
sys.path.insert(0, str(Path(__file__).resolve().parent))
from frontend_share import server_pid

PEAK_C = r'''
#include <immintrin.h>
#include <stdint.h>
/* n rounds of 12 independent accumulations, each a 16-lane vdpbf16ps (64 flops) or a 16-lane (8-lane on AVX2) FMA, in twelve
   named registers (an array of them is kept in memory by GCC, and then times the stores); returns their sum, so nothing is
   optimised away. */
#define TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
float peak_bf16(int64_t n) {
#ifdef __AVX512BF16__
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
#define DECL(i) __m512 c##i = _mm512_set1_ps((float)i);            /* distinct, or GCC merges the twelve chains into one */
#define STEP(i) c##i = _mm512_dpbf16_ps(c##i, a, b);
#define SUM(i) s += _mm512_reduce_add_ps(c##i);
    TWELVE(DECL)
    for (int64_t r = 0; r < n; r++) { TWELVE(STEP) }
    float s = 0; TWELVE(SUM) return s;
#else
    return -1.f;
#endif
}
float peak_f32(int64_t n) {
#ifdef __AVX512F__
    __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
#define FDECL(i) __m512 f##i = _mm512_set1_ps((float)i);
#define FSTEP(i) f##i = _mm512_fmadd_ps(f##i, a, b);
#define FSUM(i) s += _mm512_reduce_add_ps(f##i);
#else
    __m256 a = _mm256_set1_ps(1.0001f), b = _mm256_set1_ps(0.9999f);
#define FDECL(i) __m256 f##i = _mm256_set1_ps((float)i);
#define FSTEP(i) f##i = _mm256_fmadd_ps(f##i, a, b);
#define FSUM(i) for (int j = 0; j < 8; j++) s += f##i[j];
#endif
    TWELVE(FDECL)
    for (int64_t r = 0; r < n; r++) { TWELVE(FSTEP) }
    float s = 0; TWELVE(FSUM) return s;
}
'''

def peak_gflops(dtype: str, reps: int = 7) -> float:
    "One core's arithmetic peak in GFLOP/s for `dtype`'s products (bfloat16: vdpbf16ps, else FMA), the fastest of `reps` timings."
    lib = c_library('crowd_peak', PEAK_C, ('-O2', '-march=native', '-shared', '-fPIC'))
    if lib is None: raise SystemExit('the peak loop could not be built (a C compiler is needed)')
    f = lib.peak_bf16 if dtype == 'bfloat16' else lib.peak_f32
    f.argtypes, f.restype = [ctypes.c_int64], ctypes.c_float
    if dtype == 'bfloat16' and f(1) < 0: raise SystemExit('this CPU has no AVX512-BF16: pass --dtype float32')
    lanes = 16 if dtype == 'bfloat16' or 'avx512f' in cpu_flags() else 8
    flops_per_round = 12 * lanes * (4 if dtype == 'bfloat16' else 2)
    n, best = 20_000_000, float('inf')
    for _ in range(reps):
        t = time.perf_counter(); f(n); best = min(best, time.perf_counter() - t)
    return n * flops_per_round / best / 1e9

def crowd_flops(cfg: ModelConfig, prompt_lens: list[int], output_lens: list[int]) -> dict:
    "The crowd's product FLOPs: every layer's weights for each prompt token and decode, the LM head for each last prompt token and decode."
    H, I, qd, kvd = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    layer = H * qd + 2 * H * kvd + qd * H + 3 * H * I                  # q, k, v, o; gate, up, down
    body, head = cfg.num_hidden_layers * layer, cfg.vocab_size * H
    prefill = sum(prompt_lens) * 2 * body + len(prompt_lens) * 2 * head
    decode = sum(o - 1 for o in output_lens) * 2 * (body + head)
    return {'prefill_gflop': prefill / 1e9, 'decode_gflop': decode / 1e9}

GROUPS = ('decode call', 'prefill products', 'prefill attention', 'prefill rest', 'engine other', 'front end')

def group(frames: list[str]) -> str | None:
    "The group of one engine-thread stack (frames outermost first, as py-spy's raw format gives them)."
    names = [f.split(' (')[0] for f in frames]
    if 'DecodeCall.run' in names: return 'decode call'
    if 'ModelRunner.logits' in names:
        if '_product' in names or 'FastLinear.forward' in names: return 'prefill products'
        if 'PagedAttention.attend' in names: return 'prefill attention'
        return 'prefill rest'
    return 'engine other'

def read_profile(path: Path, rate: int) -> dict[str, float]:
    "Seconds per group from a py-spy raw profile (thread names in the first frame)."
    secs = Counter()
    for line in path.read_text().splitlines():
        if not line.strip(): continue
        stack, n = line.rsplit(' ', 1)
        frames = stack.split(';')
        if 'nanoserve-engine' in frames[0]: secs[group(frames[1:])] += int(n) / rate
        elif frames[-1].split(' (')[0] not in ('EpollSelector.select', 'select'): secs['front end'] += int(n) / rate
    return {g: secs[g] for g in GROUPS}

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--dtype', default='bfloat16')
    p.add_argument('--server-cpus', default='1'); p.add_argument('--client-cpus', default='0')
    p.add_argument('--num-requests', type=int, default=32)
    p.add_argument('--input-len', default='32:128'); p.add_argument('--output-len', default='64')
    p.add_argument('--rounds', type=int, default=3); p.add_argument('--seed', type=int, default=1)
    p.add_argument('--sample-rate', type=int, default=250)
    p.add_argument('--out', default='bench/results')
    args = p.parse_args()
    spy = shutil.which('py-spy') or str(Path(sys.executable).parent/'py-spy')
    if not Path(spy).exists(): raise SystemExit('py-spy is needed: pip install py-spy (make install-dev installs it)')
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(',')})
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr)); name = Path(path).name
    cfg, tok = ModelConfig.from_dir(path), Tokenizer.from_dir(path)
    ncpu = len(args.server_cpus.split(','))
    os.sched_setaffinity(0, {int(args.server_cpus.split(',')[0])})
    amx = args.dtype == 'bfloat16' and 'amx_bf16' in cpu_flags()        # Day 06's products run on AMX's tiles, whose peak this loop does not reach
    peak = None if amx else peak_gflops(args.dtype) * ncpu               # on the server's core, as the server would run
    if amx: print('AMX: no floor (the vdpbf16ps peak is not the products\' peak here); the profile only', file=sys.stderr)
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(',')})
    mk = lambda seed: make_plan(args.num_requests, parse_lengths(args.input_len), parse_lengths(args.output_len), seed=seed, tokenizer=tok)
    port = free_port()
    cmd = nanoserve_command(path, port, '--served-model-name', name, '--max-batch-size', str(args.num_requests), '--dtype', args.dtype)
    mach = machine().rsplit(',', 1)[0] + f", server on cpu {args.server_cpus} ({ncpu} thread(s)), client on cpu {args.client_cpus}"
    rows = []
    with spawn_server(command=cmd, port=port, cpus=args.server_cpus, env={'OMP_NUM_THREADS': str(ncpu)}) as (url, boot):
        pid = server_pid(port)
        run_plan(mk(10_000 + args.seed).as_crowd(), url, name, 'crowd')                 # warm-up: every shape the crowd meets
        for k in range(args.rounds):
            plan = mk(args.seed + k).as_crowd()
            raw = Path(args.out)/f'.crowd_profile.{k}.txt'; raw.parent.mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen([spy, 'record', '-p', str(pid), '-r', str(args.sample_rate), '--nonblocking', '-f', 'raw', '-t', '-o', str(raw)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1.0)                                                      # py-spy attached (it samples an idle server meanwhile)
            if proc.poll() is not None: raise SystemExit(f'py-spy failed: {proc.stderr.read().decode()[-400:]}')
            run = run_plan(plan, url, name, 'crowd')
            proc.send_signal(2); proc.wait(timeout=60)
            rep, secs = LoadReport.of(run), read_profile(raw, args.sample_rate)
            raw.unlink()
            ok = [r for r in run.records if r.ok]
            if len(ok) < len(run.records): print(f'round {k + 1}: {len(run.records) - len(ok)} request(s) failed; the floor counts the rest', file=sys.stderr)
            fl = crowd_flops(cfg, [r.prompt_tokens for r in ok], [output_tokens(r) for r in ok])   # the server's own counts (usage)
            floor = (fl['prefill_gflop'] + fl['decode_gflop']) / peak if peak else None
            rows.append({'round': k + 1, 'seed': args.seed + k, 'wall_s': round(rep.duration, 3), 'out_tok_s': round(rep.output_throughput, 1),
                         **{g.replace(' ', '_') + '_s': round(v, 3) for g, v in secs.items()},
                         'prompt_tokens': rep.prompt_tokens, 'output_tokens': rep.output_tokens, **{k2: round(v, 1) for k2, v in fl.items()},
                         'peak_gflops': round(peak, 1) if peak else '', 'floor_s': round(floor, 3) if floor else '',
                         'wall_over_floor': round(rep.duration / floor, 3) if floor else '',
                         'dtype': args.dtype, 'machine': mach})
            print(rows[-1], file=sys.stderr, flush=True)
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    with open(out/'crowd_profile.csv', 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
    lines = [f"machine: {mach}", f"{args.dtype}; crowd of {args.num_requests} requests, in={args.input_len} out={args.output_len}, a fresh plan a round; "
             f"py-spy at {args.sample_rate} Hz; peak {rows[0]['peak_gflops'] or '(not measured: AMX)'} GFLOP/s on the server's cores, measured once",
             'round  wall s  out tok/s  ' + '  '.join(GROUPS) + '  (s)  floor s  wall/floor']
    lines += [f"{r['round']:>5}  {r['wall_s']:6.2f}  {r['out_tok_s']:9.1f}  " + '  '.join(f"{r[g.replace(' ', '_') + '_s']:{len(g)}.2f}" for g in GROUPS)
              + (f"       {r['floor_s']:7.2f}  {r['wall_over_floor']:10.2f}" if r['floor_s'] != '' else '       (AMX: no floor)') for r in rows]
    lines.append(f"command: python bench/crowd_profile.py {' '.join(sys.argv[1:])}".rstrip())
    (out/'crowd_profile.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__': main()
