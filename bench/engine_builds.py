#!/usr/bin/env python
"""The same engine built again and again, each in a fresh process, timed at batch 1 and at 32 rows: is its speed one
speed, or one of two?

    OMP_NUM_THREADS=1 taskset -c 1 python bench/engine_builds.py --builds 10

Why it exists: nanoserve's speed was seen to settle at one of two levels from one engine build to the next (issue 51's
plain decode at about 4.0 or about 5.3 ms a step; the OpenVINO side-by-side's 640 and 936 tok/s for 32 prompts). Each
build here is a new `nanoserve` process, as a server start is: it loads the default model (bfloat16, default flags),
warms, then times a batch-1 decode (one prompt, --tokens tokens, the median step of the run) and a crowd of 32 prompts
(output tok/s), twice each, keeping the faster. The builds run one after another, nothing else beside them. Prints
each build and the slowest over the fastest; writes OUT/engine_builds.{csv,txt} with the machine and the command.
Not part of CI."""
import argparse, json, statistics, subprocess, sys
from pathlib import Path

ONE_BUILD = r"""
import json, sys, time, statistics
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.pull import pull
from nanoserve.sampling import SamplingParams
tokens = int(sys.argv[1])
t0 = time.perf_counter()
eng = build_engine(pull(), EngineConfig(dtype='bfloat16'))
boot = time.perf_counter() - t0
params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
def run(prompts):
    steps, step = [], eng.step
    def timed():
        t = time.perf_counter()
        out = step()
        steps.append(time.perf_counter() - t)
        return out
    eng.step = timed
    t = time.perf_counter()
    eng.generate(prompts, params, use_tqdm=False)
    secs = time.perf_counter() - t
    eng.step = step
    return secs, steps
prompts = [[1000 + 37 * i + j for j in range(64)] for i in range(32)]
eng.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)
one = min((run([prompts[i]]) for i in range(2)), key=lambda r: r[0])
crowd = min((run(prompts) for _ in range(2)), key=lambda r: r[0])
print(json.dumps({'boot_s': boot, 'batch1_step_ms': 1e3 * statistics.median(one[1][1:]),
                  'batch1_tok_s': tokens / one[0], 'crowd32_tok_s': 32 * tokens / crowd[0]}))
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--builds', type=int, default=10)
    p.add_argument('--tokens', type=int, default=64, help='tokens each request decodes (default 64)')
    p.add_argument('--out', type=Path, default=Path(__file__).resolve().parent / 'out' / 'engine_builds')
    a = p.parse_args()
    from nanoserve.offline_bench import machine, write_csv
    rows = []
    for i in range(a.builds):
        r = subprocess.run([sys.executable, '-c', ONE_BUILD, str(a.tokens)], capture_output=True, text=True, check=True)
        rows.append({'build': i + 1, **json.loads(r.stdout.strip().splitlines()[-1])})
        x = rows[-1]
        print(f"build {i + 1:>2}: boot {x['boot_s']:.1f} s, batch 1 {x['batch1_step_ms']:.2f} ms a step "
              f"({x['batch1_tok_s']:.1f} tok/s), 32 rows {x['crowd32_tok_s']:.1f} tok/s", flush=True)
    spread = {k: min(r[k] for r in rows) / max(r[k] for r in rows) for k in ('batch1_tok_s', 'crowd32_tok_s')}
    summary = (f"slowest / fastest build: batch 1 {spread['batch1_tok_s']:.3f}, 32 rows {spread['crowd32_tok_s']:.3f}; "
               f"medians {statistics.median(r['batch1_tok_s'] for r in rows):.1f} and "
               f"{statistics.median(r['crowd32_tok_s'] for r in rows):.1f} tok/s")
    print(summary)
    command = 'python bench/engine_builds.py ' + ' '.join(sys.argv[1:])
    for r in rows: r.update(machine=machine(), command=command.strip())
    write_csv(rows, a.out / 'engine_builds.csv')
    (a.out / 'engine_builds.txt').write_text('\n'.join([f"machine: {machine()}", f"command: {command.strip()}", '',
                                                        summary]) + '\n')
    print(f"-> {a.out}/engine_builds.{{csv,txt}}")


if __name__ == '__main__':
    main()
