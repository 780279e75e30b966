#!/usr/bin/env python
"""nano-vllm's offline workload through nanoserve's engine, and batch 1's time per token, on one model: the numbers the
card's targets name (nano-vllm reports its speed on Qwen3-0.6B this way).

The workload, as nano-vllm's bench.py describes it: 256 sequences, each a prompt of random token ids (below 10,000)
of a length drawn uniformly from 100-1,024, and an output length drawn from 100-1,024 with end-of-sequence ignored,
sampled at temperature 0.6; one short warm-up request first; the score is the output tokens asked for over the wall
time of one `generate` of all of them. Batch 1: one prompt of 128 tokens decoding 1 and then 1 + N tokens (greedy,
end ignored); (t(1 + N) - t(1)) / N is its time a token, the prefill taken out.

    python bench/gpu/nanovllm.py MODEL --device cuda --dtype bfloat16 --cuda-graphs --csv OUT.csv
    python bench/gpu/nanovllm.py MODEL --dry-run        # the plan (lengths, tokens, the engine's settings), nothing run

Any engine flag of `nanoserve serve` applies (`add_engine_flags`)."""
import argparse, csv, json, random, sys, time
from pathlib import Path

def workload(num_seqs: int = 256, lo: int = 100, hi: int = 1024, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    "(prompts as token ids, output lengths): nano-vllm's draw, from our own seeded generator."
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10_000) for _ in range(rng.randint(lo, hi))] for _ in range(num_seqs)]
    return prompts, [rng.randint(lo, hi) for _ in range(num_seqs)]

def main(argv=None) -> int:
    from nanoserve.launch import add_engine_flags, config_from_args
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('model')
    p.add_argument('--num-seqs', type=int, default=256)
    p.add_argument('--min-len', type=int, default=100)
    p.add_argument('--max-len', type=int, default=1024)
    p.add_argument('--workload-seed', type=int, default=0)
    p.add_argument('--batch1-tokens', type=int, default=128, help='batch 1 decodes this many tokens (0: skip)')
    p.add_argument('--csv', type=Path)
    p.add_argument('--label', default='', help="the run's name in the CSV")
    p.add_argument('--dry-run', action='store_true', help='print the plan and the engine settings; load nothing')
    add_engine_flags(p)
    a = p.parse_args(argv)
    prompts, outs = workload(a.num_seqs, a.min_len, a.max_len, a.workload_seed)
    import torch
    card_here = a.device != 'cuda' or torch.cuda.is_available()
    if not (a.dry_run or card_here): raise SystemExit("--device cuda, but this torch sees no CUDA device")
    # a dry run without a card checks the other settings as the CPU's, its device and recorder set aside
    aside = {} if card_here else {'device': 'cpu', 'capture_recorder': None}
    longest = max(a.max_len, 128 + a.batch1_tokens)                 # a prompt and its output, or batch 1's
    config = config_from_args(a, max_model_len=a.max_model_len or 2 * longest + 64, **aside)
    lens = [len(p) for p in prompts]
    plan = {'sequences': len(prompts), 'prompt_tokens': sum(lens), 'output_tokens': sum(outs),
            'prompt_len': [min(lens, default=0), max(lens, default=0)],
            'output_len': [min(outs, default=0), max(outs, default=0)], 'batch1_tokens': a.batch1_tokens}
    print('plan:', json.dumps(plan))
    print('engine:', {k: v for k, v in vars(config).items() if v not in (None, False)},
          '' if card_here else f'(there: device {a.device}, recorder {a.capture_recorder})')
    if a.dry_run: return 0
    from nanoserve.launch import build_engine
    from nanoserve.sampling import SamplingParams
    engine = build_engine(a.model, config)
    vocab = engine.model.config.vocab_size          # a small test model: its ids folded into its vocabulary
    if vocab <= 10_000: prompts = [[t % vocab for t in p] for p in prompts]
    engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)      # warm-up
    rows = []
    if prompts:
        params = [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True, seed=i) for i, n in enumerate(outs)]
        t = time.perf_counter()
        done = engine.generate(prompts, params, use_tqdm=False)
        took = time.perf_counter() - t
        assert [len(o.token_ids) for o in done] == outs
        rows.append({'label': a.label, 'measure': 'nano-vllm workload', 'value': sum(outs) / took,
                     'unit': 'output tok/s', 'seconds': took, **plan})
    if a.batch1_tokens:
        one = [list(range(5, 133))]
        def timed(n):
            t0 = time.perf_counter()
            engine.generate(one, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
            return time.perf_counter() - t0
        timed(a.batch1_tokens + 1)                                                     # its shapes warmed
        t1, tn = min(timed(1) for _ in range(3)), min(timed(a.batch1_tokens + 1) for _ in range(3))
        rows.append({'label': a.label, 'measure': 'batch 1', 'value': (tn - t1) / a.batch1_tokens * 1e3,
                     'unit': 'ms/token', 'seconds': tn, **plan})
    for r in rows: print(f"{r['label'] or a.model}: {r['measure']}: {r['value']:.1f} {r['unit']} ({r['seconds']:.1f} s)")
    if a.csv and rows:
        new = not a.csv.exists()
        with a.csv.open('a', newline='') as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new: w.writeheader()
            w.writerows(rows)
    return 0

if __name__ == '__main__': sys.exit(main())
