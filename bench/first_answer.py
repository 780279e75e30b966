#!/usr/bin/env python
"""The README's own question, asked of the default model many times: how often it names Paris, and how often it loops.

    python bench/first_answer.py --name baseline                        # the API's sampling, three modes, 200 seeds
    python bench/first_answer.py --name penalties --modes default \\
        --variant repetition_penalty=1.1 --variant frequency_penalty=0.5   # sampling variants on top of it
    python bench/first_answer.py --write                                # the README's sentence and the chat notebook's
                                                                         # table, from the committed results

Each answer is a chat turn through the engine that `nanoserve chat` builds (`build_engine` on the command's own flags;
a mode adds `--no-batch-invariant` or `--dtype float32`), with the model's sampling defaults, its generation_config.json
(temperature 0.2, top-p 0.9 for the default model: what the API applies, variant `api`), plus a variant's fields (the
REPL's own defaults, `CHAT_DEFAULTS`, are one such variant); seeds 0..N-1, all queued at once (the
default mode's answers do not depend on the batch; `--no-batch-invariant`'s may). Two forms of the question: the bare
one, and the README's ("... Answer in one sentence."). An answer is capped at --max-tokens (512: the chat's own bound
is the rest of the context, 8,192 tokens, which a loop would fill at minutes an answer), and counted as
- `paris`: its text names Paris;
- `length`: it ran to the cap (finish reason `length`; in the chat it would have gone on);
- `repeats`: some run of REPEAT_N tokens occurs more than REPEAT_TIMES times in it (a loop, even one that ended).
Writes bench/results/first_answer/NAME.csv (one row per mode, variant and form) and NAME_answers.csv (every answer),
each naming the machine and the commit."""
import argparse, collections, csv, json, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/'bench'/'results'/'first_answer'
QUESTION = "What is the capital of France?"
FORMS = {'bare': QUESTION, 'one_sentence': QUESTION + " Answer in one sentence."}
MODES = {'default': [], 'no-batch-invariant': ['--no-batch-invariant'], 'float32': ['--dtype', 'float32']}
REPEAT_N, REPEAT_TIMES = 4, 4        # a loop: some 4 tokens in a row occur more than 4 times in one answer
FIELDS = ['machine', 'commit', 'mode', 'variant', 'form', 'seeds', 'max_tokens', 'paris', 'length', 'repeats',
          'mean_tokens', 'seconds']

def repeats(ids: list[int], n: int = REPEAT_N, times: int = REPEAT_TIMES) -> bool:
    "Whether some run of `n` tokens occurs more than `times` times in `ids`."
    counts = collections.Counter(tuple(ids[i:i + n]) for i in range(len(ids) - n + 1))
    return bool(counts) and max(counts.values()) > times

assert repeats([5, 6, 7, 8] * 5) and not repeats([5, 6, 7, 8] * 4) and not repeats(list(range(40)))

def parse_variant(spec: str) -> dict:
    "'api' (the model's defaults as they are), or 'field=value+field=value' over SamplingParams' fields (values as JSON)."
    if spec == 'api': return {}
    out = {}
    for part in spec.split('+'):
        key, _, value = part.partition('=')
        if not value: raise SystemExit(f"--variant {spec!r}: give field=value (e.g. repetition_penalty=1.1)")
        out[key] = json.loads(value)
    return out

def commit() -> str:
    try: return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError): return 'unknown'

def chat_engine(mode_flags: list[str]):
    "The engine and the sampling defaults `nanoserve chat` would have with these flags."
    from nanoserve.cli import build_parser
    from nanoserve.pull import DEFAULT_MODEL
    from nanoserve.engine import model_dir
    from nanoserve.launch import build_engine, config_from_args
    from nanoserve.protocol import generation_defaults
    args = build_parser().parse_args(['chat', *mode_flags])
    config = config_from_args(args)
    path = model_dir(args.model or DEFAULT_MODEL, config, log=lambda m: print(m, file=sys.stderr))
    return build_engine(path, config), generation_defaults(args.generation_config, path)

def ask(engine, sampling: dict, form: str, seeds: int, max_tokens: int) -> list[dict]:
    "Every seed's answer to one form of the question, with its counts."
    from nanoserve.sampling import SamplingParams
    messages = [{'role': 'user', 'content': FORMS[form]}]
    params = [SamplingParams(**{**sampling, 'max_tokens': max_tokens, 'seed': s}) for s in range(seeds)]
    outs = engine.generate([messages] * seeds, params, use_tqdm=False)
    return [dict(seed=s, text=o.text, tokens=len(o.token_ids), finish=o.finish_reason, paris='Paris' in o.text,
                 length=o.finish_reason == 'length', repeats=repeats(o.token_ids)) for s, o in enumerate(outs)]

def measure(args):
    from nanoserve.offline_bench import machine
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    where, at = machine(), commit()
    summary, answers = [], []
    for mode in args.modes.split(','):
        engine, defaults = chat_engine(MODES[mode])
        for spec in args.variant or ['api']:
            sampling = {**defaults, **parse_variant(spec)}
            for form in FORMS:
                t0 = time.perf_counter()
                got = ask(engine, sampling, form, args.seeds, args.max_tokens)
                row = dict(machine=where, commit=at, mode=mode, variant=spec, form=form, seeds=args.seeds,
                           max_tokens=args.max_tokens, paris=sum(a['paris'] for a in got),
                           length=sum(a['length'] for a in got), repeats=sum(a['repeats'] for a in got),
                           mean_tokens=round(sum(a['tokens'] for a in got) / len(got), 1),
                           seconds=round(time.perf_counter() - t0, 1))
                summary.append(row)
                answers += [dict(mode=mode, variant=spec, form=form, **a) for a in got]
                print(f"{mode:20} {spec:32} {form:13} Paris {row['paris']:3}/{row['seeds']}  length {row['length']:3}"
                      f"  repeats {row['repeats']:3}  mean {row['mean_tokens']:6} tokens  {row['seconds']} s",
                      flush=True)
        engine.close()
        del engine
    write_csv(out/f'{args.name}.csv', summary, FIELDS)
    write_csv(out/f'{args.name}_answers.csv', answers, list(answers[0]))
    print(f"wrote {out/args.name}.csv and {args.name}_answers.csv ({where}, commit {at})")

def write_csv(path: Path, rows: list[dict], fields: list[str]):
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)

# --write: what the README says of the question, and the chat notebook's table, from the committed results
API = ('chat_defaults_before', 'default', 'api')             # the API's defaults (the model's generation_config.json)
def repl_variant() -> str:
    "The REPL's defaults as a variant spec (what `nanoserve chat` adds to the model's sampling)."
    from nanoserve.chat import CHAT_DEFAULTS
    return '+'.join(f'{k}={json.dumps(v)}' for k, v in CHAT_DEFAULTS.items()) or 'api'
REPL = ('chat_defaults_after', 'default', None)               # None: repl_variant()
TABLES = ('before_f32_logits', 'chat_defaults_before', 'penalties', 'chat_defaults_after')
MARK = '<!-- first-answer: python bench/first_answer.py --write -->', '<!-- /first-answer -->'
NOTEBOOK, CELL_ID = 'nbs/61_chat.ipynb', 'first-answer'

def rows(name: str, results: Path = RESULTS) -> list[dict]:
    return list(csv.DictReader(open(results/f'{name}.csv', newline='')))

def pick(name: str, mode: str, variant: str | None, form: str, results: Path = RESULTS) -> dict:
    variant = variant or repl_variant()
    return next(r for r in rows(name, results) if (r['mode'], r['variant'], r['form']) == (mode, variant, form))

def sentence(results: Path = RESULTS) -> str:
    "The README's paragraph on the question, read from the committed results."
    one, bare = pick(*API, 'one_sentence', results), pick(*API, 'bare', results)
    repl = pick(*REPL, 'bare', results)
    machine = bare['machine'].split(', x86_64')[0]
    text = (f'Asked as "Answer in one sentence." with these defaults, this 135M model (4-bit weights from its GGUF) names '
            f"Paris in {one['paris']} of {one['seeds']} seeds; asked the bare question, in {bare['paris']} of "
            f"{bare['seeds']}, and {bare['length']} of those {bare['seeds']} answers loop until they are cut off at "
            f"{bare['max_tokens']} tokens. `nanoserve chat` adds sampling defaults of its own against such loops "
            f"({repl_variant().replace('+', ', ')}): with them the bare question names Paris in {repl['paris']} of "
            f"{repl['seeds']} seeds and loops in {repl['length']}. Measured by `python bench/first_answer.py` "
            f"(bfloat16, the chat's engine, seeds 0-{int(bare['seeds']) - 1}; {machine}, commit {bare['commit']}); "
            "the chat notebook has the whole table.")
    return wrap(text)

def wrap(text: str, width: int = 120) -> str:
    lines, line = [], ''
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else: line = f'{line} {word}' if line else word
    return '\n'.join(lines + [line])

def table(results: Path = RESULTS) -> str:
    "The chat notebook's table: every committed run, one row per mode, sampling and form."
    head = ('| run | mode | sampling | question | names Paris | cut off | repeats itself | mean tokens |\n'
            '|---|---|---|---|---|---|---|---|')
    out, where = [head], {}
    for name in TABLES:
        for r in rows(name, results):
            form = 'bare' if r['form'] == 'bare' else 'one sentence'
            out.append(f"| {name} | {r['mode']} | {r['variant'].replace('+', ', ')} | {form} | {r['paris']}/{r['seeds']} | "
                       f"{r['length']}/{r['seeds']} | {r['repeats']}/{r['seeds']} | {r['mean_tokens']} |")
            where.setdefault(r['machine'], {}).setdefault(r['commit'], None)
    cap = {r['max_tokens'] for name in TABLES for r in rows(name, results)}
    machines = '; '.join(f"{m} (commits {', '.join(c)})" for m, c in where.items())
    return ('\n'.join(out) + f"\n\nCut off: ran to {', '.join(sorted(cap))} tokens; repeats itself: some {REPEAT_N} tokens in "
            f"a row occur more than {REPEAT_TIMES} times. Measured on {machines}.")

def section(text: str) -> str:
    "The README's (or the landing page's) marked paragraph, markers included."
    start = text.index(MARK[0])
    return text[start:text.index(MARK[1], start) + len(MARK[1])]

def marked(results: Path = RESULTS) -> str: return f'{MARK[0]}\n{sentence(results)}\n{MARK[1]}'

def write(root: Path = ROOT):
    "The paragraph into nbs/index.ipynb and README.md, the table into the chat notebook's cell."
    for path in (root/'nbs'/'index.ipynb', root/NOTEBOOK):
        nb = json.loads(path.read_text())
        for c in nb['cells']:
            src = ''.join(c['source'])
            if path.name == 'index.ipynb' and MARK[0] in src: src = src.replace(section(src), marked())
            elif c.get('id') == CELL_ID: src = table()
            c['source'] = src.splitlines(keepends=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    readme = (root/'README.md').read_text()
    (root/'README.md').write_text(readme.replace(section(readme), marked()))

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--name', default='baseline', help='the results file: RESULTS/NAME.csv')
    p.add_argument('--results', default=str(RESULTS), help=f'the folder of results (default {RESULTS.relative_to(ROOT)})')
    p.add_argument('--modes', default=','.join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument('--variant', action='append', help="sampling on top of the model's defaults: 'api' (none) or "
                   "field=value+field=value (repeatable; default: api)")
    p.add_argument('--seeds', type=int, default=200)
    p.add_argument('--max-tokens', type=int, default=512)
    p.add_argument('--write', action='store_true', help="put the README's paragraph and the chat notebook's table, "
                   'read from the committed results, into nbs/index.ipynb, README.md and nbs/61_chat.ipynb')
    args = p.parse_args(argv)
    if args.write: write()
    else: measure(args)

if __name__ == '__main__': main()
