#!/usr/bin/env python
"""The prefix cache through the server: one multi-turn chat plan, the same server with and without it, side by side in one run.

    python bench/prefix_cache.py                       # the default model, 16 conversations x 4 turns = 64 requests
    python bench/prefix_cache.py --model DIR --conversations 8 --turns 4 --system-len 256

Each arm is `nanoserve serve` on loopback (server on cpu 1, the client on cpu 0, as bench/peers/side_by_side.py pins them), the
plan `make_chat_plan` (Day 40): a shared system prompt, every turn re-sending its conversation so far. The plan runs as a crowd
(every request at t=0, in turn order) and at an open-loop rate, each run on a fresh server (an empty cache). Prints and writes OUT/prefix_cache.csv and .txt: TTFT p50/p99,
output throughput, and the hit rate from the usage each response reports (`prompt_tokens_details.cached_tokens`).
"""
import argparse, csv, os, sys, time
from pathlib import Path
from nanoserve.loadgen import spawn_server, make_chat_plan, run_plan
from nanoserve.loadreport import LoadReport
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import machine
from nanoserve.tokenizer import Tokenizer

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--out', default='bench/results')
    p.add_argument('--conversations', type=int, default=16); p.add_argument('--turns', type=int, default=4)
    p.add_argument('--system-len', type=int, default=256); p.add_argument('--output-len', type=int, default=32)
    p.add_argument('--rate', type=float, default=2.0); p.add_argument('--server-cpus', default='1'); p.add_argument('--client-cpus', default='0')
    args = p.parse_args()
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr))
    if args.client_cpus and hasattr(os, 'sched_setaffinity'): os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(',')})
    plan = make_chat_plan(args.conversations, args.turns, system_len=args.system_len, user_len=(16, 48), answer_len=48,
                          output_len=args.output_len, tokenizer=Tokenizer.from_dir(path), seed=0)
    rows, lines = [], []
    for mode, pl in (('crowd', plan), (f'open {args.rate}/s', plan.at_rate(args.rate))):
        for arm, flags in (('prefix cache on', ()), ('prefix cache off', ('--no-prefix-cache',))):
            with spawn_server(path, '--served-model-name', 'm', '--max-batch-size', '32', *flags, cpus=args.server_cpus,
                              env={'OMP_NUM_THREADS': '1'}) as (url, _):          # a fresh server a run: each starts with an empty cache
                rep = LoadReport.of(run_plan(pl, url, 'm', mode='crowd' if mode == 'crowd' else 'open'), label=f'{arm}, {mode}')
                assert rep.failed == 0, rep.errors
                rows.append({'arm': arm, 'mode': mode, 'requests': rep.completed, 'prompt_tokens': rep.prompt_tokens,
                             'hit_rate': rep.prefix_cache_hit_rate, 'ttft_p50_ms': 1e3 * rep.ttft.p50, 'ttft_p99_ms': 1e3 * rep.ttft.p99,
                             'tpot_p50_ms': 1e3 * rep.tpot.p50, 'output_tok_s': rep.output_throughput, 'duration_s': rep.duration})
                print(rows[-1], flush=True)
    for mode in dict.fromkeys(r['mode'] for r in rows):
        on, off = [next(r for r in rows if r['arm'] == f'prefix cache {a}' and r['mode'] == mode) for a in ('on', 'off')]
        lines.append(f"{mode}: TTFT p50 {on['ttft_p50_ms']:.0f} ms on vs {off['ttft_p50_ms']:.0f} off ({off['ttft_p50_ms'] / on['ttft_p50_ms']:.2f}x), "
                     f"p99 {on['ttft_p99_ms']:.0f} vs {off['ttft_p99_ms']:.0f}; output {on['output_tok_s']:.1f} vs {off['output_tok_s']:.1f} tok/s "
                     f"({on['output_tok_s'] / off['output_tok_s']:.2f}x); hit rate {on['hit_rate']:.0%} (off: {off['hit_rate']:.0%})")
    head = [f"machine: {machine()}; server on cpus {args.server_cpus} (OMP_NUM_THREADS=1), client on {args.client_cpus}, default dtype",
            f"plan: {plan.name}, {len(plan)} requests, fingerprint {plan.fingerprint}; {time.strftime('%Y-%m-%d')}"]
    lines = head + lines + [f"command: python bench/prefix_cache.py {' '.join(sys.argv[1:])}".rstrip()]
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    with open(out/'prefix_cache.csv', 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
    (out/'prefix_cache.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
