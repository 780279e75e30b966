"""What the batch-invariant mode costs: two engines built alike but for --batch-invariant, the same workloads through
each, per dtype (and quantization): bench offline's batch-32 workload, batch 1 (one request at a time), and one long
prompt's prefill, with the prefix cache off (each run computes its prompts again). Each workload runs through the two
engines back to back, their order flipping every round, so that both see the same phase of this VM's memory (its rate
moves by a third every few seconds); the verdict is the median of the rounds' paired ratios. Writes
bench/results/batch_invariance.csv and .txt. Not part of CI.

    python bench/batch_invariance.py [--rounds 7] [--arms bfloat16,float32,int8,int4] [--long 2000]
"""
import argparse, statistics
from alternating import write_results
from nanoserve.launch import build_engine
from nanoserve.quant import quantize_model
from nanoserve.offline_bench import make_workload, run_nanoserve, machine
from nanoserve.pull import pull

p = argparse.ArgumentParser()
p.add_argument('--rounds', type=int, default=7)
p.add_argument('--arms', default='bfloat16,float32,int8,int4', help='dtypes, or int8/int4 (bfloat16, so quantized)')
p.add_argument('--num-requests', type=int, default=32)
p.add_argument('--output-len', type=int, default=128)
p.add_argument('--batch1-requests', type=int, default=2)
p.add_argument('--long', type=int, default=2000, help="the long prompt's tokens (0: skip)")
p.add_argument('--out', default='bench/results')
args = p.parse_args()
path = pull()
MODES = ('default', 'invariant')

def engine(arm: str, invariant: bool):
    q = arm if arm in ('int8', 'int4') else 'none'
    return build_engine(path, dtype='bfloat16' if q != 'none' else arm, quantization=q, quantize=quantize_model,
                        batch_invariant=invariant, max_batch_size=args.num_requests, num_kv_blocks=2048,
                        prefix_cache=False, max_model_len=max(2048, args.long + 16))

def rate(eng, ws, name: str) -> float:
    "Output tokens a second over the workloads `ws`, one after another (prompt tokens a second for the long prefill)."
    results = [run_nanoserve(eng, w) for w in ws]
    secs = sum(r.seconds for r in results)
    return args.long / secs if name == 'long_prefill' else sum(w.num_output_tokens for w in ws) / secs

rows, lines = [], [f"machine: {machine()}"]
for arm in args.arms.split(','):
    engines = {'default': engine(arm, False), 'invariant': engine(arm, True)}
    assert [e.runner.batch_invariant for e in engines.values()] == [False, True]
    vocab = engines['default'].model.config.vocab_size
    work = {'batch32': [make_workload(args.num_requests, (32, 256), args.output_len, vocab, seed=0)],
            'batch1': [make_workload(1, (32, 256), args.output_len, vocab, seed=1 + i)
                       for i in range(args.batch1_requests)]}
    if args.long: work['long_prefill'] = [make_workload(1, (args.long, args.long), 1, vocab, seed=9)]
    for eng in engines.values(): rate(eng, work['batch1'][:1], 'batch1')          # warm: kernels built
    for name, ws in work.items():
        seen = {m: [] for m in MODES}
        for r in range(args.rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                seen[mode].append(rate(engines[mode], ws, name))
                rows.append({'arm': arm, 'workload': name, 'round': r, 'mode': mode, 'rate': round(seen[mode][-1], 2),
                             'unit': 'prompt tok/s' if name == 'long_prefill' else 'output tok/s'})
        ratios = [i / d for d, i in zip(seen['default'], seen['invariant'])]
        d, i = (statistics.median(seen[m]) for m in MODES)
        lines.append(f"{arm:9s} {name:13s} default {d:8.1f}  invariant {i:8.1f} {rows[-1]['unit']}  invariant/default: "
                     f"median of {args.rounds} paired rounds {statistics.median(ratios):.3f} "
                     f"(range {min(ratios):.3f}-{max(ratios):.3f})")
    del engines
write_results(args.out, 'batch_invariance', rows, lines)
