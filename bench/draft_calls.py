#!/usr/bin/env python
"""Where a draft's step goes: the decode calls of a plain engine, of a `--speculative draft` engine's model (its verify
steps) and of its draft, timed inside the engines as they generate the same prompts at batch 1.

    python bench/draft_calls.py [--rounds 2] [--num-speculative-tokens 3] [--out DIR]

Each engine's `DecodeCall.run` is wrapped by a timer (the call itself is unchanged); the two engines run the random
workload's prompts (greedy, 256 tokens, ignore_eos) in alternating rounds. Reported: milliseconds per call and the
number of calls of each, and the output tokens per second of each engine. Writes OUT/draft_calls.txt with the machine
and command."""
import argparse, collections, sys, time
from pathlib import Path
from nanoserve.launch import build_engine
from nanoserve.offline_bench import machine, make_workload
from nanoserve.pull import resolve_model
from nanoserve.sampling import SamplingParams


def timed(obj, name: str, key: str, spent: dict, calls: collections.Counter):
    "Wrap obj.name so that each call's seconds add to spent[key]."
    f = getattr(obj, name)
    def g(*a, **kw):
        t = time.perf_counter()
        try: return f(*a, **kw)
        finally:
            spent[key] += time.perf_counter() - t
            calls[key] += 1
    setattr(obj, name, g)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None)
    p.add_argument('--rounds', type=int, default=2)
    p.add_argument('--prompts', type=int, default=2)
    p.add_argument('--num-speculative-tokens', type=int, default=3)
    p.add_argument('--out', type=Path, default=Path(__file__).resolve().parent / 'out' / 'speculative')
    a = p.parse_args()
    path = resolve_model(a.model, log=lambda m: print(m, file=sys.stderr))
    plain = build_engine(path, dtype='bfloat16', max_batch_size=1)
    spec = build_engine(path, dtype='bfloat16', max_batch_size=1, speculative='draft',
                        num_speculative_tokens=a.num_speculative_tokens)
    spent, calls = collections.defaultdict(float), collections.Counter()
    timed(plain.runner.decode_call, 'run', 'plain engine: model', spent, calls)
    timed(spec.runner.decode_call, 'run', 'draft engine: model (verify steps)', spent, calls)
    timed(spec.scheduler.proposer.runner.decode_call, 'run', 'draft engine: draft', spent, calls)
    w = make_workload(a.prompts, (32, 256), 256, plain.model.config.vocab_size, seed=0)
    params = SamplingParams(max_tokens=256, temperature=0, ignore_eos=True)
    for e in (plain, spec): e.generate(w.prompts[:1], params, use_tqdm=False)          # warm
    spent.clear()
    calls.clear()
    tok_s = collections.defaultdict(list)
    for r in range(a.rounds):
        for name, e in ((('plain', plain), ('draft', spec)) if r % 2 == 0 else (('draft', spec), ('plain', plain))):
            t = time.perf_counter()
            outs = e.generate(w.prompts, params, use_tqdm=False)
            tok_s[name].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t))
    lines = [f"machine: {machine()}", f"command: python bench/draft_calls.py {' '.join(sys.argv[1:])}".strip(), '']
    lines += [f"{k}: {spent[k] / calls[k] * 1000:.3f} ms a call over {calls[k]} calls" for k in spent]
    lines += [f"{k} engine: {', '.join(f'{x:.1f}' for x in v)} output tok/s by round" for k, v in tok_s.items()]
    print('\n'.join(lines))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / 'draft_calls.txt').write_text('\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
