#!/usr/bin/env python
"""Tensor parallelism on this machine: tokens/s and per-rank memory for 1, 2 and 3 ranks, measured side by side in one run.

    python bench/tensor_parallel.py                   # the default model (1 and 3 ranks) and a random model of its shape with 6 KV heads (1, 2, 3)

The default model's 3 KV heads split over 1 or 3 ranks only; the second model is SmolLM2-135M's shape (30 layers, hidden 576, MLP 1536,
vocabulary 49152) with 12 query heads over 6 KV heads, random weights (nanoserve.tiny), so that 2 ranks can be measured too.
Each run: `build_engine` with --tensor-parallel-size N (the workers started here, the cores split evenly between the ranks), the same
workload (8 requests, 64-token prompts, 64 output tokens, greedy, ignore_eos), then the engine closed. Memory: every rank's parameter bytes
(gathered from the ranks), the KV pool bytes of one rank (the same 256 blocks in every run) and each rank's resident memory. Writes OUT/tensor_parallel.csv and .txt.
"""
import argparse, os, subprocess, sys, tempfile
from pathlib import Path
import torch
from nanoserve.pull import resolve_model
from nanoserve.launch import build_engine
from nanoserve.offline_bench import make_workload, run_nanoserve, write_csv, machine
from nanoserve.weights import weight_bytes
from nanoserve.tiny import tiny_checkpoint

def rss(pid: int | str = 'self') -> int:
    "Resident bytes of a process (VmRSS)."
    for line in open(f'/proc/{pid}/status'):
        if line.startswith('VmRSS:'): return int(line.split()[1]) * 1024
    return 0

def run(label: str, path, world: int, args) -> dict:
    engine = build_engine(path, dtype=args.dtype, max_batch_size=8, num_kv_blocks=256, tensor_parallel_size=world)
    try:
        w = make_workload(args.num_requests, (args.prompt_len, args.prompt_len), args.output_len, engine.model.config.vocab_size, seed=0)
        r = run_nanoserve(engine, w)
        tp = getattr(engine.model, 'tensor_parallel', None)
        workers = [rss(p.pid) for p in tp.workers] if tp else []
        return {'model': label, 'ranks': world, 'dtype': str(engine.model.dtype).removeprefix('torch.'), 'threads_per_rank': torch.get_num_threads(),
                'output_tok_s': round(r.output_tok_s, 1), 'step_ms_p50': round(r.step_ms_p50, 1),
                'rank0_weight_mib': round(weight_bytes(engine.model) / 2**20, 1),
                'rank_weight_mib': ' '.join(f'{b / 2**20:.1f}' for b in tp.weight_bytes) if tp else f'{weight_bytes(engine.model) / 2**20:.1f}', 'rank0_kv_mib': round(engine.plan.kv_bytes / 2**20, 1),
                'worker_rss_mib': ' '.join(str(round(b / 2**20)) for b in workers), 'machine': machine()}
    finally: engine.close()

LATENCY = """
import os, sys, time, torch, torch.distributed as dist
from nanoserve.parallel import TensorParallel, rank_from_env
rank, world, addr, port = rank_from_env(); torch.set_num_threads(1)
tp = TensorParallel.connect(rank, world, addr, port)
x, w, ts = torch.randn(8, 576), torch.randn(576, 576), []
for i in range(300):
    y = (x @ w) @ w                                   # some work between collectives, as in a step
    t = time.perf_counter(); dist.all_reduce(x, group=tp.step); ts.append(time.perf_counter() - t); x /= world
ts = sorted(ts[50:])
if rank == 0: print(f"{ts[len(ts) // 2] * 1e6:.0f} {ts[int(len(ts) * 0.9)] * 1e6:.0f} {sum(ts) / len(ts) * 1e6:.0f}")
sys.stdout.flush(); os._exit(0)
"""

def collective_latency(world: int) -> dict:
    "One all-reduce of a decode step's [8, 576] activations between `world` processes on this machine, one thread each: p50, p90, mean in us."
    env = {**os.environ, 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': str(29800 + world), 'WORLD_SIZE': str(world), 'OMP_NUM_THREADS': '1'}
    procs = [subprocess.Popen([sys.executable, '-c', LATENCY], env={**env, 'RANK': str(r)}, stdout=subprocess.PIPE, text=True) for r in range(world)]
    out = [p.communicate(timeout=300)[0] for p in procs]
    p50, p90, mean = map(int, out[0].split())
    return {'ranks': world, 'allreduce_us_p50': p50, 'allreduce_us_p90': p90, 'allreduce_us_mean': mean}

def baseline_rss() -> int:
    "Resident bytes of a process that imported nanoserve and compiled Day 06's GEMV, with no model: what every rank pays before its shard."
    code = ("import torch, nanoserve.parallel; from nanoserve.fast import one_row_product; one_row_product(torch.zeros(1, 8), torch.zeros(2, 8)); "
            "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])")
    return int(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout) * 1024

QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.", "Who wrote Hamlet?",
             "Explain photosynthesis in one sentence.", "What is 12 times 7?", "Name a famous painter.", "Give me a tip for learning to code.")

def agreement(path, dtype: str, world: int, max_tokens: int = 32) -> dict:
    "Greedy chat answers of `world` ranks against one process in `dtype`: the share identical, and where the others first differ."
    from nanoserve.engine import Engine
    from nanoserve.sampling import SamplingParams
    msgs, sp = [[{'role': 'user', 'content': q}] for q in QUESTIONS], SamplingParams(max_tokens=max_tokens, temperature=0)
    want = [o.token_ids for o in Engine.build(path, dtype=dtype, max_batch_size=8).generate(msgs, sp, use_tqdm=False)]
    split = Engine.build(path, dtype=dtype, max_batch_size=8, tensor_parallel_size=world)
    try: got = [o.token_ids for o in split.generate(msgs, sp, use_tqdm=False)]
    finally: split.close()
    first = [next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), None) for w, g in zip(want, got)]
    return {'dtype': dtype, 'ranks': world, 'identical': sum(w == g for w, g in zip(want, got)), 'prompts': len(QUESTIONS),
            'first_divergence': ' '.join('-' if f is None else str(f) for f in first)}

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default='bench/results'); p.add_argument('--dtype', default='auto')
    p.add_argument('--num-requests', type=int, default=8); p.add_argument('--prompt-len', type=int, default=64); p.add_argument('--output-len', type=int, default=64)
    args = p.parse_args()
    default = resolve_model(None, log=lambda m: print(m, file=sys.stderr))
    six = tiny_checkpoint(Path(tempfile.mkdtemp(prefix='six-kv-')), seed=0, vocab_size=49152, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=30, num_attention_heads=12, num_key_value_heads=6, max_position_embeddings=2048, tie_word_embeddings=True)
    rows = []
    for label, path, worlds in (('SmolLM2-135M-Instruct', default, (1, 3)), ('135M shape, 6 KV heads (random)', six, (1, 2, 3))):
        for n in worlds:
            rows.append(run(label, path, n, args)); print(rows[-1], file=sys.stderr, flush=True)
    agree = [agreement(default, dt, 3) for dt in ('float32', 'bfloat16')]
    lat = [collective_latency(n) for n in (2, 3)]
    base = round(baseline_rss() / 2**20)
    out = Path(args.out); write_csv(rows, out/'tensor_parallel.csv'); write_csv([{**l, 'machine': machine()} for l in lat], out/'tensor_parallel_allreduce.csv')
    lines = [f"machine: {machine()}; {args.num_requests} requests x {args.prompt_len}-token prompts x {args.output_len} output tokens, greedy",
             f"{'model':<34}{'ranks':>6}{'dtype':>10}{'threads':>8}{'out tok/s':>11}{'step p50 ms':>13}{'weights MiB per rank':>22}{'KV MiB':>8}{'worker RSS MiB':>16}"]
    for r in rows:
        lines.append(f"{r['model']:<34}{r['ranks']:>6}{r['dtype']:>10}{r['threads_per_rank']:>8}{r['output_tok_s']:>11.1f}{r['step_ms_p50']:>13.1f}"
                     f"{r['rank_weight_mib']:>22}{r['rank0_kv_mib']:>8.1f}{r['worker_rss_mib'] or '-':>16}")
    lines.append(f"a process with nanoserve imported and no model: {base} MiB resident (the rest of a worker's RSS is its shard, KV pool and buffers)")
    for l in lat: lines.append(f"all-reduce of [8, 576] float32 between {l['ranks']} processes, 1 thread each: p50 {l['allreduce_us_p50']} us, "
                               f"p90 {l['allreduce_us_p90']} us, mean {l['allreduce_us_mean']} us (a step has 2 per layer + 1 gather: 61 here)")
    for a in agree: lines.append(f"greedy agreement, SmolLM2-135M-Instruct on {a['ranks']} ranks vs one process, {a['dtype']}: {a['identical']}/{a['prompts']} "
                                 f"chat answers identical over 32 tokens; first differing token per prompt: {a['first_divergence']}")
    write_csv([{**a, 'machine': machine()} for a in agree], out/'tensor_parallel_agreement.csv')
    (out/'tensor_parallel.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
