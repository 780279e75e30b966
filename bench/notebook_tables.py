"""The notebooks' "Measured" tables, printed from the committed results they cite, as the README's performance section is.

    python bench/notebook_tables.py            # print every table (markdown)
    python bench/notebook_tables.py --write    # put each into its notebook, between its markers

A table sits in its notebook's markdown between `<!-- table: NAME ... -->` and `<!-- /table -->`; everything else in the
cell is prose. tests/test_notebook_tables.py fails when a notebook's table disagrees with this output, or when a file it
reads is missing. Every number is a median or a sum over a run's rounds as the run's CSV records them."""
import argparse, csv, json, statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
ZEN5 = ROOT/'bench'/'results'/'latest'/'zen5'

def read(path: Path) -> list[dict]: return list(csv.DictReader(open(path, newline='')))
def median(rows: list[dict], key: str) -> float: return statistics.median(float(r[key]) for r in rows)
def tok_s(v: float) -> str: return f'{v:,.1f}'
def ms(v: float) -> str: return f'{v:,.0f}' if v >= 100 else f'{v:.1f}'

def pick(table: list[dict], **kw) -> list[dict]:
    "The rows of `table` whose columns have the values `kw` gives."
    got = [r for r in table if all(r[k] == str(v) for k, v in kw.items())]
    if not got: raise KeyError(f'no rows with {kw}')
    return got

def cases(rows: list[dict]) -> list[tuple[str, str]]:
    "The (workload, batch) cases of a speculation run, in the order it ran them."
    return list(dict.fromkeys((r['workload'], r['batch']) for r in rows))

def speculative(path: Path) -> str:
    """`bench/speculative.py`: plain against ngram, per workload and batch: medians of the rounds, proposals accepted summed
    over them."""
    rows, out = read(path), ['| workload | batch | plain tok/s | ngram tok/s | speedup | proposals accepted | '
                             'output tokens a step |', '|---|---|---|---|---|---|---|']
    for w, b in cases(rows):
        plain, ngram = pick(rows, workload=w, batch=b, arm='none'), pick(rows, workload=w, batch=b, arm='ngram')
        p, n = median(plain, 'output_tok_s'), median(ngram, 'output_tok_s')
        drafted, kept = (sum(int(r[k]) for r in ngram) for k in ('draft_tokens', 'accepted_tokens'))
        per_step = statistics.median(int(r['output_tokens']) / int(r['steps']) for r in ngram)     # as the script prints it
        share = f' ({kept / drafted:.0%})' if drafted else ''
        out.append(f'| {w} | {b} | {tok_s(p)} | {tok_s(n)} | {n / p:.2f}x | {kept:,} / {drafted:,}{share} | '
                   f'{per_step:.2f} |')
    return '\n'.join(out)

def speculative_llamacpp(path: Path) -> str:
    "`bench/speculative.py --llamacpp-venv`: nanoserve's arms and llama.cpp's, batch 1."
    rows = read(path)
    out = ['| workload | nanoserve plain | nanoserve ngram | llama.cpp plain | llama.cpp lookup | '
           'nanoserve ngram / llama.cpp lookup |', '|---|---|---|---|---|---|']
    for w, b in cases(rows):
        m = {arm: median(pick(rows, workload=w, batch=b, arm=arm), 'output_tok_s')
             for arm in ('none', 'ngram', 'llama.cpp plain', 'llama.cpp lookup')}
        out.append(f"| {w} | {tok_s(m['none'])} | {tok_s(m['ngram'])} ({m['ngram'] / m['none']:.2f}x) | "
                   f"{tok_s(m['llama.cpp plain'])} | {tok_s(m['llama.cpp lookup'])} "
                   f"({m['llama.cpp lookup'] / m['llama.cpp plain']:.2f}x) | {m['ngram'] / m['llama.cpp lookup']:.2f}x |")
    return '\n'.join(out)

def speculative_draft(*paths: Path) -> str:
    "`bench/speculative.py --method draft`, two runs side by side; the share of proposals kept over both."
    runs = [read(p) for p in paths]
    head = ' | '.join(f'`{p.stem}` plain | draft | speedup' for p in paths)
    out = [f'| workload | batch | {head} | proposals kept |', '|---|---|' + '---|' * (3 * len(paths) + 1)]
    for w, b in cases(runs[0]):
        cells, drafted, kept = [], 0, 0
        for rows in runs:
            plain, draft = pick(rows, workload=w, batch=b, arm='none'), pick(rows, workload=w, batch=b, arm='draft')
            p, d = median(plain, 'output_tok_s'), median(draft, 'output_tok_s')
            cells.append(f'{tok_s(p)} | {tok_s(d)} | {d / p:.2f}x')
            drafted += sum(int(r['draft_tokens']) for r in draft)
            kept += sum(int(r['accepted_tokens']) for r in draft)
        out.append(f"| {w} | {b} | {' | '.join(cells)} | {f'{kept / drafted:.0%}' if drafted else 'none proposed'} |")
    return '\n'.join(out)

def crowd_budget(path: Path) -> str:
    "`bench/crowd_budget.py`: each whole budget's medians over the rounds, largest first."
    rows = read(path)
    out = ['| whole budget | out tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms |', '|---|---|---|---|---|---|']
    for budget in sorted({r['budget'] for r in rows}, key=int, reverse=True):
        got = pick(rows, budget=budget)
        values = [median(got, k) for k in ('output_throughput', 'ttft_p50_ms', 'ttft_p99_ms', 'tpot_p50_ms', 'itl_p99_ms')]
        out.append(f"| {budget} | {values[0]:,.0f} | {' | '.join(ms(v) for v in values[1:])} |")
    return '\n'.join(out)

def batch_invariance(path: Path) -> str:
    "`bench/batch_invariance.py`: invariant over default, the median of the rounds' paired ratios (and their range)."
    rows = read(path)
    arms = list(dict.fromkeys(r['arm'] for r in rows))
    what = {'batch32': 'offline, 32 requests of 32-256 prompt tokens x 128', 'batch1': 'batch 1 (two requests, one at a time)',
            'long_prefill': "one 2,000-token prompt's prefill"}
    out = [f"| invariant / default (median of the paired rounds) | {' | '.join(arms)} |", '|---|' + '---|' * len(arms)]
    for w in dict.fromkeys(r['workload'] for r in rows):
        cells = []
        for arm in arms:
            got = pick(rows, arm=arm, workload=w)
            rate = {(r['round'], r['mode']): float(r['rate']) for r in got}
            ratios = [rate[rd, 'invariant'] / rate[rd, 'default'] for rd in dict.fromkeys(r['round'] for r in got)]
            cells.append(f'{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})')
        out.append(f"| {what.get(w, w)} | {' | '.join(cells)} |")
    return '\n'.join(out)

def quant_speed(path: Path) -> str:
    "`bench/capture_cpu.py --arms eager,int8,int4`: decode tokens a second, medians of the rounds, against bfloat16's."
    rows = read(path)
    out = ['| rows | bfloat16 decode tok/s | int8 | int8 / bfloat16 | int4 | int4 / bfloat16 |', '|---|---|---|---|---|---|']
    for n in sorted({r['rows'] for r in rows}, key=int):
        bf, i8, i4 = (median(pick(rows, rows=n, arm=arm), 'decode_tok_s') for arm in ('eager', 'int8', 'int4'))
        out.append(f'| {n} | {tok_s(bf)} | {tok_s(i8)} | {i8 / bf:.2f}x | {tok_s(i4)} | {i4 / bf:.2f}x |')
    return '\n'.join(out)

@dataclass(frozen=True)
class Table:
    name: str                     # the marker's name
    notebook: str                 # under the repository root
    files: tuple[Path, ...]       # the results it reads
    render: Callable[..., str]

TABLES = [Table('speculative', 'nbs/15_speculative.ipynb', (ZEN5/'speculative.csv',), speculative),
          Table('speculative_llamacpp', 'nbs/15_speculative.ipynb', (ZEN5/'speculative_llamacpp.csv',),
                speculative_llamacpp),
          Table('speculative_draft', 'nbs/19_draft.ipynb',
                (ZEN5/'speculative_draft.csv', ZEN5/'speculative_draft_run2.csv'), speculative_draft),
          Table('crowd_budget', 'nbs/16_scheduler.ipynb', (ZEN5/'crowd_budget.csv',), crowd_budget),
          Table('batch_invariance', 'nbs/12_attention.ipynb', (ROOT/'bench'/'results'/'batch_invariance.csv',),
                batch_invariance),
          Table('quant_speed', 'nbs/55_quant.ipynb', (ZEN5/'quant_speed.csv',), quant_speed)]

def begin(t: Table) -> str: return f'<!-- table: {t.name} (python bench/notebook_tables.py --write) -->'
END = '<!-- /table -->'

def marked(t: Table) -> str: return f'{begin(t)}\n{t.render(*t.files)}\n{END}'

def section(text: str, t: Table) -> str | None:
    "The marked table in `text`, markers included; None where `text` has none."
    if (start := text.find(begin(t))) < 0: return None
    return text[start:text.index(END, start) + len(END)]

def cells(t: Table) -> list[str]:
    "The notebook's markdown cells holding the table's markers."
    nb = json.loads((ROOT/t.notebook).read_text())
    return [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown' and begin(t) in ''.join(c['source'])]

def write():
    for t in TABLES:
        path = ROOT/t.notebook
        nb = json.loads(path.read_text())
        for c in nb['cells']:
            src = ''.join(c['source'])
            if c['cell_type'] == 'markdown' and (old := section(src, t)) is not None:
                c['source'] = src.replace(old, marked(t)).splitlines(keepends=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--write', action='store_true', help='put each table into its notebook, between its markers')
    if p.parse_args().write: write()
    else: print('\n\n'.join(f'{t.notebook}, {t.name}:\n{marked(t)}' for t in TABLES))
