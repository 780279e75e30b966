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

# The speed issue's passes: each table reads the run its pass committed under bench/results/archive/ (summary rows the
# script wrote: medians, or the fastest round where the column says so), the rows the notebook shows
ARCHIVE = ROOT/'bench'/'results'/'archive'

def row_of(table: list[dict], threads, rows) -> dict:
    "The one summary row of `table` for (threads, rows)."
    got = pick(table, threads=threads, rows=rows)
    if len(got) != 1: raise KeyError(f'{len(got)} rows for {threads} threads, {rows} rows')
    return got[0]

def f32_linear(path: Path) -> str:
    "`bench/f32_linear.py`: oneDNN's float32 product against the kernel, medians and fastest rounds."
    out = ['| threads | rows | oneDNN ms (median, fastest) | kernel ms | x (medians) | kernel GFLOP/s | '
           "kernel's weights GB/s |", '|---|---|---|---|---|---|---|']
    for r in read(path):
        out.append(f"| {r['threads']} | {r['rows']} | {float(r['onednn_ms']):.1f}, {float(r['onednn_best_ms']):.1f} | "
                   f"{float(r['kernel_ms']):.1f}, {float(r['kernel_best_ms']):.1f} | {float(r['speedup']):.2f} | "
                   f"{float(r['kernel_gflops']):.0f} | {float(r['kernel_weights_gbs']):.1f} |")
    return '\n'.join(out)

def f32_linear_avx2(path: Path) -> str:
    "The same held to AVX2 on both sides."
    out = ['| threads | rows | oneDNN (AVX2) ms, median (fastest) | kernel (AVX2) ms | x (medians) |', '|---|---|---|---|---|']
    for r in read(path):
        out.append(f"| {r['threads']} | {r['rows']} | {float(r['onednn_ms']):.1f} ({float(r['onednn_best_ms']):.1f}) | "
                   f"{float(r['kernel_ms']):.1f} ({float(r['kernel_best_ms']):.1f}) | {float(r['speedup']):.2f} |")
    return '\n'.join(out)

def amx_linear(path: Path) -> str:
    "`bench/amx_linear.py`: oneDNN's packed bfloat16 product against the AMX kernel, fastest rounds."
    table = read(path)
    out = ["| threads | rows | oneDNN ms | AMX ms | AMX / oneDNN | AMX's weights GB/s, share of a sum's |",
           '|---|---|---|---|---|---|']
    for t, n in ((2, 1), (2, 8), (2, 32), (2, 64), (1, 1), (1, 32)):
        o, a = (pick(table, threads=t, rows=n, arm=arm)[0] for arm in ('onednn', 'amx'))
        om, am = float(o['step_ms_min']), float(a['step_ms_min'])
        out.append(f"| {t} | {n} | {om:.1f} | {am:.1f} | {om / am:.2f}x | {float(a['weights_gb_s']):.1f}, "
                   f"{float(a['share_of_bandwidth']):.0%} |")
    return '\n'.join(out)

def amx_prefetch(path: Path) -> str:
    "`bench/amx_prefetch.py`, two runs (the CSV holds them in turn): medians, and each run's ratio."
    table, runs = read(path), {}
    for r in table: runs.setdefault((r['threads'], r['rows']), []).append(r)
    out = ['| threads | rows | no prefetch ms | prefetch ms | x, run 1 | x, run 2 |', '|---|---|---|---|---|---|']
    for t, n in (('2', '1'), ('2', '8'), ('2', '16'), ('2', '32'), ('1', '1'), ('1', '8'), ('1', '32')):
        a, b = runs[t, n]
        out.append(f"| {t} | {n} | {float(a['no_prefetch_ms']):.1f}, {float(b['no_prefetch_ms']):.1f} | "
                   f"{float(a['prefetch_ms']):.1f}, {float(b['prefetch_ms']):.1f} | {float(a['speedup']):.2f} | "
                   f"{float(b['speedup']):.2f} |")
    return '\n'.join(out)

def amx_dot(path: Path) -> str:
    "`bench/amx_dot.py`: the tiles, the engine's build and dot products up to 4 rows; medians."
    table = read(path)
    out = ["| threads | rows | tiles ms | engine's build | dots up to 4 rows | a sum's rate |", '|---|---|---|---|---|---|']
    for i, (t, n) in enumerate(((2, 1), (2, 2), (2, 4), (2, 5), (1, 1), (1, 2), (1, 4))):
        r = row_of(table, t, n)
        engine = 'tiles' if r['engine_takes'] == 'tiles' else f"{float(r['speedup']):.2f}x"
        dots = 'tiles' if n > 4 else f"{float(r['dots4_speedup']):.2f}x"
        rate = f"{float(r['sum_gbs']):.1f}" + (' GB/s' if i == 0 else '')
        out.append(f"| {t} | {n} | {float(r['tiles_ms']):.1f} | {float(r['engine_ms']):.1f} ({engine}) | "
                   f"{float(r['dots4_ms']):.1f} ({dots}) | {rate} |")
    return '\n'.join(out)

def bf16_dot(path: Path) -> str:
    "`bench/bf16_dot.py`: oneDNN's bfloat16 product, the dot products, the float32 kernel; medians."
    table = read(path)
    out = ["| threads | rows | oneDNN bfloat16 ms | dot products ms | float32 kernel ms | dots' weights GB/s, share of a "
           "sum's |", '|---|---|---|---|---|---|']
    for t in (2, 1):
        for n in (1, 4, 8, 16, 32):
            r = row_of(table, t, n)
            out.append(f"| {t} | {n} | {float(r['onednn_ms']):.1f} | {float(r['dots_ms']):.1f} "
                       f"({float(r['dots_vs_onednn']):.2f}x) | {float(r['f32_ms']):.1f} | {float(r['dots_gbs']):.1f}, "
                       f"{float(r['dots_gbs']) / float(r['sum_gbs']):.0%} |")
    return '\n'.join(out)

def bf16_dot_passes(path: Path) -> str:
    "`bench/bf16_dot.py` against the thirteenth pass's build in the same rounds; medians."
    table = read(path)
    out = ['| threads | rows | thirteenth pass ms | this pass ms | x thirteenth | x oneDNN bfloat16 |', '|---|---|---|---|---|---|']
    for t in (1, 2):
        for n in (1, 8, 16, 32):
            r = row_of(table, t, n)
            out.append(f"| {t} | {n} | {float(r['dots-13th_ms']):.1f} | {float(r['dots_ms']):.1f} | "
                       f"{float(r['dots_vs_13th']):.2f}x | {float(r['dots_vs_onednn']):.2f}x |")
    return '\n'.join(out)

def decode_attention(path: Path) -> str:
    "`bench/decode_attention.py`: SDPA with the gather against three passes' kernels; the fastest of the rounds."
    table = read(path)
    out = ["| dtype, threads | SDPA with the gather | third pass's kernel | fifth pass's kernel | this kernel |",
           '|---|---|---|---|---|']
    for dt in ('bfloat16', 'float32'):
        for t in (1, 2):
            ms = [float(pick(table, dtype=dt, threads=t, arm=arm)[0]['step_ms_min'])
                  for arm in ('sdpa', 'kernel-3rd-pass', 'kernel-5th-pass', 'kernel')]
            out.append(f"| {dt}, {t} | {' | '.join(f'{v:.1f} ms' for v in ms)} |")
    return '\n'.join(out)

def ab_arms(two: Path, one: Path) -> str:
    "`bench/ab_arms.py --arms layers,fast`, on two threads and on one core: the fastest and the median round."
    out = ['| rows | threads | layers, ms (fastest / median round) | one call, ms | x (fastest) |', '|---|---|---|---|---|']
    for path, label in ((two, None), (one, '1 (one core)')):
        table = read(path)
        for i, n in enumerate(dict.fromkeys(r['rows'] for r in table)):
            layers, fast = (pick(table, rows=n, arm=arm)[0] for arm in ('layers', 'fast'))
            t = label if label and i == 0 else layers['threads']
            lm, fm = float(layers['step_ms_min']), float(fast['step_ms_min'])
            out.append(f"| {n} | {t} | {lm:.1f} / {float(layers['step_ms_median']):.1f} | {fm:.1f} / "
                       f"{float(fast['step_ms_median']):.1f} | {lm / fm:.2f} |")
    return '\n'.join(out)

def scheduler_budget(path: Path, earlier: Path) -> str:
    "`bench/scheduler_budget.py`: runs 1 and 2 from their printed summaries (`earlier`), run 3 from its CSV; medians."
    runs = {}
    for line in earlier.read_text().splitlines():
        f = line.split()
        if len(f) == 6 and '/' in f[0] and f[0][0].isdigit():
            runs.setdefault(f[0], []).append((float(f[1]), float(f[3]), float(f[4])))      # tok/s, ITL p99, TTFT p50
    table = read(path)
    for budget in dict.fromkeys(f"{r['whole']}/{r['mixed']}" for r in table):
        w, m = budget.split('/')
        got = pick(table, whole=w, mixed=m)
        runs[budget].append(tuple(median(got, k) for k in ('out_tok_s', 'itl_p99_ms', 'ttft_p50_ms')))
    out = ['| whole / mixed budget | out tok/s, runs 1 / 2 / 3 | ITL p99 ms | TTFT p50 ms |', '|---|---|---|---|']
    for budget in dict.fromkeys(f"{r['whole']}/{r['mixed']}" for r in table):
        cols = [' / '.join(f'{run[k]:.0f}' for run in runs[budget]) for k in range(3)]
        out.append(f"| {budget.replace('/', ' / ')} | {' | '.join(cols)} |")
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
          Table('quant_speed', 'nbs/55_quant.ipynb', (ZEN5/'quant_speed.csv',), quant_speed),
          Table('f32_linear', 'nbs/06_f32_linear.ipynb', (ARCHIVE/'eighth_pass'/'f32_linear.csv',), f32_linear),
          Table('f32_linear_avx2', 'nbs/06_f32_linear.ipynb', (ARCHIVE/'ninth_pass'/'f32_linear.csv',), f32_linear_avx2),
          Table('amx_linear', 'nbs/06_fast.ipynb', (ARCHIVE/'fourth_pass'/'amx_linear.csv',), amx_linear),
          Table('amx_prefetch', 'nbs/06_fast.ipynb', (ARCHIVE/'ninth_pass'/'amx_prefetch.csv',), amx_prefetch),
          Table('amx_dot', 'nbs/06_fast.ipynb', (ARCHIVE/'tenth_pass'/'amx_dot.csv',), amx_dot),
          Table('bf16_dot', 'nbs/06_fast.ipynb', (ARCHIVE/'thirteenth_pass'/'bf16_dot.csv',), bf16_dot),
          Table('bf16_dot_passes', 'nbs/06_fast.ipynb', (ARCHIVE/'fourteenth_pass'/'bf16_dot.csv',), bf16_dot_passes),
          Table('decode_attention', 'nbs/12_attention.ipynb', (ARCHIVE/'sixth_pass'/'decode_attention.csv',),
                decode_attention),
          Table('decode_call_bf16', 'nbs/13_decode_call.ipynb',
                (ARCHIVE/'fifth_pass'/'two_threads'/'ab_arms.csv', ARCHIVE/'fifth_pass'/'one_core'/'ab_arms.csv'), ab_arms),
          Table('decode_call_f32', 'nbs/13_decode_call.ipynb',
                (ARCHIVE/'ninth_pass'/'ab_f32_call'/'ab_arms.csv', ARCHIVE/'ninth_pass'/'ab_f32_call_one_core'/'ab_arms.csv'),
                ab_arms),
          Table('scheduler_budget', 'nbs/16_scheduler.ipynb', (ARCHIVE/'seventh_pass'/'scheduler_budget.csv',
                ARCHIVE/'seventh_pass'/'scheduler_budget_earlier_runs.txt'), scheduler_budget)]

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
