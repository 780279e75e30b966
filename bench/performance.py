"""The README's performance section, printed from the committed results in bench/results/latest/: a headline table (a
row per workload and peer, at most ten, each the latest run, its machine named) and its plot; and the site's page of
every machine's tables.

    python bench/performance.py            # print the headline section (markdown)
    python bench/performance.py --page     # print the page of every machine's tables
    python bench/performance.py --write    # the headline into nbs/index.ipynb, nbs/24_offline_bench.ipynb and
                                           # README.md, its plot into nbs/performance.png, the page into
                                           # nbs/performance.ipynb

Every number is read from a file under bench/results/latest/ (bench/results/latest/README.md says which command wrote
each one, on which machine, at which commit); tests/test_performance.py fails when the README, the notebooks or the page
disagree with this output, or when a file it cites is missing."""
import argparse, csv, json, re, statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LATEST = ROOT/'bench'/'results'/'latest'
HEADING = '## Performance'
CELL_ID = 'performance'                            # the markdown cell that holds the section, in each notebook
NOTEBOOKS = ('nbs/index.ipynb', 'nbs/24_offline_bench.ipynb')

# One table per machine family: its folder under latest/, a title, when its runs were committed and at which commits,
# and the runs. offline: `nanoserve bench offline`; side_by_side: bench/peers/side_by_side.py; llamacpp: bench/quant.py
# --llamacpp-venv; goodput: side_by_side.py --goodput; openvino: bench/peers/openvino_side_by_side.py; quant:
# bench/capture_cpu.py --arms eager,int8,int4 (nanoserve's quantized modes against its bfloat16); memory:
# bench/memory.py (peak resident memory against the budget: a lead above 1 is within it); ab: nanoserve alone
# before and after a change (bench/offline_ab.sh's layout); prefill: `nanoserve bench prefill --compare-modes
# --compare-vllm` (one prompt at a time, or a crowd, to its first token); shaped_*: side_by_side.py --model on a
# real-size shape (bench/shaped_checkpoint.py), its crowd and 1 request/s; moe: bench/moe.py beside llama.cpp and
# vLLM on mixtures of experts' shapes (bench/moe_checkpoint.py), each row's medians already taken (moe.csv).
FAMILIES = [
    dict(folder='zen4', title='AMD Zen 4 VM', date='2026-12-04', commits='beff1e6, 7b7101f',
         runs=[('offline', 'offline.csv'), ('side_by_side', 'side_by_side.csv')]),
    dict(folder='zen5', title='AMD Zen 5 VM', date='2026-12-03 to 2026-12-05',
         commits='713fff7, cf295c6, fc2a1ff, 5699a65, 0509de0, c9a4011, 406ff6c, 0822af9, ba063d8, 9b2cfca',
         runs=[('offline', 'offline.csv'), ('side_by_side', 'side_by_side.csv'), ('goodput', 'goodput.csv'),
               ('openvino', 'openvino.csv'), ('openvino_int4', 'openvino_int4.csv'), ('quant', 'quant_speed.csv'),
               ('llamacpp', 'quant_llamacpp.csv'), ('speculative', 'speculative.csv'),
               ('speculative_llamacpp', 'speculative_llamacpp.csv'), ('speculative_draft', 'speculative_draft.csv'),
               ('speculative_draft', 'speculative_draft_run2.csv'), ('memory', 'memory.csv'),
               ('ab', 'device_discipline_ab.csv')]),
    dict(folder='sapphire_rapids', title='Intel Sapphire Rapids VM (AMX)', date='2026-12-02 and 2026-12-06',
         commits='6c17c3f, 085832b, 4e38734, 03e123e',
         runs=[('offline', 'offline.csv'), ('side_by_side', 'side_by_side.csv'), ('prefill', 'prefill.csv'),
               ('shaped_1.7b', 'side_by_side_1.7b_shape.csv'), ('shaped_360m', 'side_by_side_360m_shape.csv'),
               ('moe', 'moe.csv')]),
    dict(folder='h200', title='NVIDIA H200', date='2026-12-04', commits='dea9936',
         note="nanoserve with `--cuda-graphs`, on SmolLM2-135M's shapes with random weights, from a copy of the"
              ' project at that commit with one line patched (see bench/results/latest/README.md)',
         device='NVIDIA H200', runs=[('offline', 'offline_cuda.csv')]),
    dict(folder='amd_epyc', title='AMD EPYC VM (family not recorded), against llama.cpp', date='2026-12-01',
         commits='3ae078a', runs=[('llamacpp', 'quant.csv')]),
]

def read(path: Path) -> list[dict]: return list(csv.DictReader(open(path, newline='')))
def median(rows: list[dict], key: str) -> float: return statistics.median(float(r[key]) for r in rows)
def peer_name(engine: str) -> str:
    if engine.startswith('vllm '): return f"vLLM {engine.split()[1]}"
    return {'transformers.generate': 'transformers', 'llama.cpp': 'llama.cpp'}.get(engine, engine)
def row(what: str, dtype: str, ours: float, peer: str, theirs: float, lower_is_better: bool = False) -> str:
    lead = theirs / ours if lower_is_better else ours / theirs
    return f"| {what} | {dtype} | {ours:,.1f} | {peer} | {theirs:,.1f} | {lead:.2f}x |"

def offline_rows(rows: list[dict]) -> list[str]:
    "Each dtype's nanoserve at its batch beside every peer of the same run: medians of the rounds' output tok/s."
    out = []
    for dt in dict.fromkeys(r['dtype'] for r in rows):
        ours = [r for r in rows if r['engine'] == 'nanoserve' and r['dtype'] == dt and r['batch'] != '1']
        n, batch = len(ours), ours[0]['batch']
        rounds = f"median of {n} rounds" if n > 1 else 'one round'
        what = f"offline, {ours[0]['num_requests']} requests, batch {batch}: output tok/s ({rounds})"
        for peer in dict.fromkeys(r['engine'] for r in rows if r['engine'] != 'nanoserve'):
            theirs = [r for r in rows if r['engine'] == peer and r['dtype'] == dt]
            out.append(row(what, dt, median(ours, 'output_tok_s'), peer_name(peer), median(theirs, 'output_tok_s')))
    return out

SERVER_ROWS = [('crowd', 'output_throughput', 'output tok/s', False),
               ('4.0', 'output_throughput', 'output tok/s', False),
               ('crowd', 'ttft_p50_ms', 'TTFT p50 ms', True),
               ('crowd', 'tpot_p50_ms', 'TPOT p50 ms', True), ('crowd', 'itl_p99_ms', 'ITL p99 ms', True)]

SHAPED_ROWS = [('crowd', 'output_throughput', 'output tok/s', False), ('crowd', 'ttft_p50_ms', 'TTFT p50 ms', True),
               ('crowd', 'itl_p99_ms', 'ITL p99 ms', True), ('1.0', 'output_throughput', 'output tok/s', False),
               ('1.0', 'ttft_p50_ms', 'TTFT p50 ms', True)]

SHAPES = {'shaped_1.7b': 'SmolLM2-1.7B shape', 'shaped_360m': 'SmolLM2-360M shape'}

def side_by_side_rows(rows: list[dict], spec: list = SERVER_ROWS, model: str | None = None) -> list[str]:
    """Each `spec` row (the crowd, or an open-loop rate) of each server: medians of the interleaved rounds; `model`
    names a real-size shape's run (bench/peers/side_by_side.py --model DIR) in each measure."""
    out, dt = [], rows[0]['dtype']
    rounds = len({r['label'] for r in rows if r['label'].split()[0] == 'nanoserve'})
    for mode, key, name, lower in spec:
        pick = lambda server: [r for r in rows
                               if r['label'].split()[0] == server and (r['mode'] == mode or r['rate'] == mode)]
        ours = pick('nanoserve')
        rate = 0 if mode == 'crowd' else float(mode)
        where = f"a crowd of {ours[0]['num_requests']}" if mode == 'crowd' else f"{rate:g} request{'s' * (rate != 1)}/s"
        what = f"{model + ', ' if model else ''}server, {where}: {name} (median of {rounds} rounds)"
        out.append(row(what, dt, median(ours, key), 'vLLM (CPU)', median(pick('vllm'), key), lower))
    return out

def llamacpp_rows(rows: list[dict]) -> list[str]:
    "Batch 1 with the decode step recorded, 16-bit and 4-bit weights, beside llama.cpp's F16 and Q4_1."
    get = lambda engine, quant: next(r for r in rows if r['engine'].startswith(engine) and r['quantization'] == quant)
    out = []
    for ours, theirs, bits in ((get('nanoserve', 'none'), get('llama.cpp', 'F16'), '16-bit'),
                               (get('nanoserve', 'int4-pull'), get('llama.cpp', 'Q4_1'), '4-bit')):
        if ours['dtype'] != 'bfloat16':
            ours = next(r for r in rows if r['engine'] == 'nanoserve' and r['dtype'] == 'bfloat16')
        what = f"batch 1, {bits} weights ({ours['quantization']} / {theirs['quantization']}), step recorded: tok/s"
        out.append(row(what, ours['dtype'], float(ours['batch1_recorded_tok_s']), theirs['engine'],
                       float(theirs['batch1_tok_s'])))
    int4, f16 = get('nanoserve', 'int4'), get('llama.cpp', 'F16')
    out.append(row("batch 1, nanoserve's int4 (quantized at load) against llama.cpp's F16, eager: tok/s", 'bfloat16',
                   float(int4['batch1_tok_s']), f16['engine'], float(f16['batch1_tok_s'])))
    return out

def goodput_rows(rows: list[dict]) -> list[str]:
    "The goodput sweep: each server's highest open-loop rate at which enough requests met the objectives."
    best = lambda server: max(float(r['rate']) for r in rows if r['server'] == server and r['passed'] == 'True')
    slo = ' and '.join(f"{k.upper()} <= {v} ms" for k, v in (x.split(':') for x in rows[0]['slo'].split(',')))
    n = next(r['num_requests'] for r in rows)
    share = f"{float(rows[0]['min_share']):.0%}"
    what = f"server goodput: the highest rate with {share} of {n} requests within {slo}, req/s"
    return [row(what, rows[0]['dtype'], best('nanoserve'), 'vLLM (CPU)', best('vllm'))]

def openvino_rows(rows: list[dict], weights: str | None = None) -> list[str]:
    """Batch 1 and all prompts at once against OpenVINO GenAI: medians of the alternating rounds' output tok/s;
    `weights`: nanoserve's quantized weights in that run."""
    out = []
    for batch in dict.fromkeys(r['batch'] for r in rows):
        pick = lambda kind: [r for r in rows if r['kind'] == kind and r['batch'] == batch]
        ours, theirs = pick('nanoserve'), pick('openvino')
        what = (f"offline, {ours[0]['prompts']} prompts of {ours[0]['prompt_len']} tokens, batch {batch}: output tok/s "
                f"(median of {len(ours)} rounds){f', nanoserve with {weights} weights' if weights else ''}")
        out.append(row(what, ours[0]['engine'].split()[-1], median(ours, 'output_tok_s'),
                       f"OpenVINO GenAI ({theirs[0]['engine'].split()[-1]})", median(theirs, 'output_tok_s')))
    return out

def quant_rows(rows: list[dict]) -> list[str]:
    "nanoserve's quantized modes against its bfloat16 at the fewest and most rows: decode tok/s, medians of the rounds."
    out = []
    for rows_n in (min(int(r['rows']) for r in rows), max(int(r['rows']) for r in rows)):
        base = [r for r in rows if r['arm'] == 'eager' and int(r['rows']) == rows_n]
        for arm in dict.fromkeys(r['arm'] for r in rows if r['arm'] != 'eager'):
            mine = [r for r in rows if r['arm'] == arm and int(r['rows']) == rows_n]
            what = f"decode at {rows_n} row{'s' * (rows_n > 1)}: tok/s, {arm} weights (median of {len(mine)} rounds)"
            out.append(row(what, 'bfloat16', median(mine, 'decode_tok_s'), 'nanoserve bfloat16',
                           median(base, 'decode_tok_s')))
    return out

def speculative_rows(rows: list[dict], peers=(('none', 'nanoserve without it'),), method: str = 'ngram',
                     label: str = '') -> list[str]:
    """`--speculative METHOD` against each of `peers` ((arm, name): plain decoding, or llama.cpp's lookup decoding) per
    workload and batch: medians of the alternating rounds' output tok/s."""
    out = []
    for key in dict.fromkeys((r['workload'], r['batch']) for r in rows):
        pick = lambda arm: [r for r in rows if (r['workload'], r['batch']) == key and r['arm'] == arm]
        ours = pick(method)
        what = (f"`--speculative {method}`{label}, {key[0]} prompts, batch {key[1]}: output tok/s (median of "
                f"{len(ours)} rounds)")
        for arm, peer in peers:
            if theirs := pick(arm):
                out.append(row(what, 'bfloat16', median(ours, 'output_tok_s'), peer, median(theirs, 'output_tok_s')))
    return out

def memory_rows(rows: list[dict]) -> list[str]:
    """Peak resident memory of `nanoserve generate` and of `nanoserve serve` (each command's latest label) against the
    budget: weights + KV pool + 0.5 GB."""
    command = lambda r: r['command'].split()[1]
    last = {command(r): r['label'] for r in rows}
    out = []
    for r in (r for r in rows if r['label'] == last[command(r)]):
        what = (f"peak resident MB, `nanoserve {command(r)}`, {r['model']} model, {r['mode']} "
                "(VmHWM, `/usr/bin/time -v`)")
        out.append(row(what, 'bfloat16', float(r['peak_rss_mb']), 'budget: weights + KV pool + 512 MB',
                       float(r['budget_mb']), lower_is_better=True))
    return out

def prefill_rows(rows: list[dict]) -> list[str]:
    """`nanoserve bench prefill --compare-modes --compare-vllm`: each mode's time to the first token beside vLLM's on
    the same token ids, a row per prompt length, batch and mode (medians of the rounds)."""
    key = lambda r: (r['engine'], int(r['prompt_len']), int(r['batch']))
    runs = {}
    for r in rows: runs.setdefault(key(r), []).append(r)
    out = []
    for (engine, n, batch), rs in runs.items():
        if engine.startswith('vllm '): continue
        peer = next((k for k in runs if k[0].startswith('vllm ') and k[1:] == (n, batch)), None)
        if peer is None: continue
        mode = '' if engine == 'nanoserve' else ', `--no-batch-invariant`'
        what = (f"a {n:,}-token prompt alone{mode}: TTFT ms" if batch == 1 else
                f"{batch} prompts of {n:,} tokens at once{mode}: TTFT mean ms")
        threads = int(rs[0]['threads'])
        what += f" (median of {len(rs)} round{'s' * (len(rs) > 1)}, {threads} thread{'s' * (threads > 1)})"
        out.append(row(what, rs[0]['dtype'],
                       median(rs, 'ttft_mean_ms'), peer_name(peer[0]), median(runs[peer], 'ttft_mean_ms'),
                       lower_is_better=True))
    return out

def moe_rows(rows: list[dict]) -> list[str]:
    "The mixtures of experts' rows, as bench/results/latest's moe.csv gives them (each side's median of its rounds)."
    return [row(r['measure'], r['dtype'], float(r['nanoserve']), r['peer'], float(r['peers'])) for r in rows]

def ab_line(rows: list[dict], path: str) -> str:
    "nanoserve alone before and after a later change on this family: the ratio of the medians, per dtype and batch."
    keys = dict.fromkeys((r['dtype'], r['batch']) for r in rows)
    side = lambda s, k: [r for r in rows if r['side'] == s and (r['dtype'], r['batch']) == k]
    ratios = ', '.join(f"{median(side('after', k), 'output_tok_s') / median(side('before', k), 'output_tok_s'):.2f}"
                       f" ({k[0]}, batch {k[1]})" for k in keys)
    commits = ' -> '.join(dict.fromkeys(r['commit'] for r in rows))
    return (f"Since then, nanoserve alone ({commits}, `{path}`): output tok/s after / before, medians of "
            f"{len({r['round'] for r in rows})} alternating rounds: {ratios}.")

def family_table(fam: dict, latest: Path) -> str:
    "One family's dated table: its machine, the files it reads, a row per measure and peer, and any later A/B."
    lines, machines, notes, cited = [], [], [], []
    for kind, name in fam['runs']:
        rows, rel = read(latest/fam['folder']/name), f"bench/results/latest/{fam['folder']}/{name}"
        # a run whose CSV has no machine column names it on its text's first line
        host = rows[0].get('machine') or (latest/fam['folder']/name).with_suffix('.txt').read_text().split('\n')[0]
        host = host.removeprefix('machine: ')
        machine = f"{fam['device']}; host {host}" if fam.get('device') else host
        if machine not in machines: machines.append(machine)
        if fam.get('note') and fam['note'] not in notes: notes.append(fam['note'] + '.')
        if kind == 'ab':
            notes.append(ab_line(rows, rel))
            continue
        if kind == 'side_by_side':
            plan = rows[0]['plan'].removesuffix(' crowd')
            cores = rows[0]['server_cpus']
            notes.insert(0, f"The server rows' plan: `{plan}`; each server on {cores} core, the client on another.")
        if kind in SHAPES:
            plan = rows[0]['plan'].removesuffix(' crowd')
            notes.append(f"The {SHAPES[kind]} rows: `{plan}` and 1 request/s on a random checkpoint of that shape with "
                         "the default model's tokenizer (bench/shaped_checkpoint.py; speed does not depend on the "
                         "weights' values).")
        if kind == 'moe':
            notes.append("The mixture-of-experts rows: random checkpoints of OLMoE-1B-7B's and Qwen3-30B-A3B's shapes "
                         "(bench/moe_checkpoint.py), `python bench/moe.py decode|crowd` beside llama.cpp on the same "
                         "weights (bench/peers/moe_gguf.py) and vLLM (bench/peers/vllm_crowd.py), rounds alternated "
                         "(bench/results/moe/).")
        cited.append(f"`{rel}`")
        lines += {'offline': offline_rows, 'side_by_side': side_by_side_rows, 'llamacpp': llamacpp_rows,
                  'goodput': goodput_rows, 'openvino': openvino_rows, 'quant': quant_rows,
                  'openvino_int4': lambda rows: openvino_rows(rows, 'int4'), 'speculative': speculative_rows,
                  'speculative_llamacpp': lambda rows: speculative_rows(rows, (('llama.cpp lookup',
                                                                                'llama.cpp prompt lookup'),)),
                  'speculative_draft': lambda rows: speculative_rows(rows, method='draft',
                                                                    label=f" (int4 self-draft, `{name}`)"),
                  'memory': memory_rows, 'prefill': prefill_rows, 'moe': moe_rows,
                  **{k: lambda rows, m=m: side_by_side_rows(rows, SHAPED_ROWS, m)
                     for k, m in SHAPES.items()}}[kind](rows)
    commits = fam['commits'].split(', ')
    head = [f"### {fam['title']}, {fam['date']}", '', ' '.join(f'`{m}`.' for m in machines),
            f"From {', '.join(cited)} (commit{'s' * (len(commits) > 1)} {', '.join(commits)}).", '',
            "| measure | dtype | nanoserve | peer | peer's | nanoserve's lead |", '|---|---|---|---|---|---|']
    return '\n'.join(head + lines + ([''] + [' '.join(notes)] if notes else []))

INTRO = """SmolLM2-135M-Instruct, nanoserve beside its peers in the same run on the same machine: absolute numbers drift
from one machine (and one minute) to the next, ratios from one run do not. The offline rows are `nanoserve bench offline
--compare-transformers --compare-vllm` (prompts of 32-256 random tokens, 128 output tokens each, greedy, `ignore_eos`);
the server rows are `bench/peers/side_by_side.py` (32 requests, prompts of 32-128 tokens, 64 output tokens, each server
pinned to one core, the rounds interleaved; the goodput row is its `--goodput ttft:1000,tpot:100` sweep). "nanoserve's
lead" is nanoserve's throughput over the peer's, or the peer's
latency over nanoserve's: above 1 nanoserve is ahead. Generated by `python bench/performance.py` from
`bench/results/latest/` (its README names each run's command, machine and commit); every earlier run is in
`bench/results/archive/`."""

def render_page(latest: Path = LATEST) -> str:
    "The site's page, markdown: a short preface, then one dated table per machine family."
    intro = f"{PAGE_HEADING}\n\n" + ' '.join(INTRO.split())
    return '\n\n'.join([intro] + [family_table(f, latest) for f in FAMILIES]) + '\n'

PAGE_HEADING = '## Every machine, every run'
PAGE = 'nbs/performance.ipynb'
PLOT = 'nbs/performance.png'
# The headline: (family folder, a substring of the measure, the peer's name as the table gives it), in order; each the
# latest run of its workload against that peer. At most ten.
HEADLINE = [('zen5', 'offline, 64 requests, batch 32: output tok/s', 'vLLM 0.32.0', 'bfloat16'),
            ('zen5', 'server, a crowd of 32: output tok/s', 'vLLM (CPU)', 'bfloat16'),
            ('zen5', 'server, a crowd of 32: TTFT p50 ms', 'vLLM (CPU)', 'bfloat16'),
            ('zen5', 'server, a crowd of 32: ITL p99 ms', 'vLLM (CPU)', 'bfloat16'),
            ('zen5', 'server goodput', 'vLLM (CPU)', 'bfloat16'),
            ('zen5', 'offline, 32 prompts of 40 tokens, batch 32: output tok/s (median of 3 rounds) |',
             'OpenVINO GenAI (bf16)', 'bfloat16'),
            ('zen5', 'batch 1, 16-bit weights (none / F16), step recorded', 'llama.cpp (llama-cpp-python 0.3.36)',
             'bfloat16'),
            ('zen5', 'extractive prompts, batch 1', 'llama.cpp prompt lookup', 'bfloat16'),
            ('sapphire_rapids', 'a 4,000-token prompt alone: TTFT ms', 'vLLM 0.32.0', 'bfloat16'),
            ('h200', 'offline, 64 requests, batch 64', 'transformers', 'bfloat16')]

def table_rows(fam: dict, latest: Path) -> list[list[str]]:
    "A family's table rows, each split into its cells (measure, dtype, nanoserve, peer, peer's, lead)."
    lines = family_table(fam, latest).splitlines()
    return [[c.strip() for c in line.strip('|').split('|')] for line in lines if line.startswith('| ') and
            line.endswith('x |')]

def headline_rows(latest: Path = LATEST) -> list[dict]:
    "The HEADLINE rows: each one's measure, short machine name, figures and lead, read as the page reads them."
    fams, out = {f['folder']: f for f in FAMILIES}, []
    for folder, measure, peer, dtype in HEADLINE:
        exact = measure.endswith(' |')                         # the whole measure, not a part of it
        cells = next(c for c in table_rows(fams[folder], latest)
                     if (c[0] == measure[:-2] if exact else measure in c[0]) and c[3] == peer and c[1] == dtype)
        out.append({'measure': cells[0], 'machine': fams[folder]['title'].split(',')[0], 'ours': cells[2],
                    'peer': cells[3], 'theirs': cells[4], 'lead': float(cells[5].rstrip('x'))})
    return out

HEADLINE_INTRO = """SmolLM2-135M-Instruct (bfloat16), nanoserve beside each peer on the latest run of each workload, the peers
in the same run on the same machine. "lead" is nanoserve's throughput over the peer's, or the peer's latency over
nanoserve's: above 1 nanoserve is ahead. Every machine's tables, with their commands, machines and commits, are on
[the performance page](performance.ipynb); `python bench/performance.py --write` writes both from `bench/results/latest/`.
These leads were won on a 135M model with short prompts: a long prompt's first token still comes a little later than
vLLM's (the 4,000-token row), and on real-size models the lead shrinks: on the AMX machine a SmolLM2-1.7B-shaped
crowd is about even with vLLM on output and behind it on ITL (the performance page; the prefill notebook,
[Day 65](65_prefill_bench.ipynb), measures why). Mixtures of experts, the performance page's Sapphire Rapids rows
([Day 72](06_grouped_experts.ipynb)): on OLMoE-1B-7B's shape in bfloat16 nanoserve leads vLLM's CPU build 1.71x in an
offline crowd of 32 and llama.cpp 1.16x at batch 1 (76-83% of the bandwidth ceiling of its active weights); on
Qwen3-30B-A3B's shape llama.cpp's Q4_0 leads nanoserve's int4 at batch 1 (0.92x: its int4 products multiply in
bfloat16), and nanoserve's w4a8 leads it 1.22x."""

def render(latest: Path = LATEST) -> str:
    "The README's section, markdown: a preface, the headline table and its plot."
    rows = headline_rows(latest)
    assert len(rows) <= 10, 'the headline holds at most ten rows'
    table = ['| measure | machine | nanoserve | peer | peer\'s | lead |', '|---|---|---|---|---|---|']
    table += [f"| {r['measure']} | {r['machine']} | {r['ours']} | {r['peer']} | {r['theirs']} | {r['lead']:.2f}x |"
              for r in rows]
    plot = "![nanoserve's lead over each peer, the headline's rows](performance.png)"
    return '\n\n'.join([HEADING, ' '.join(HEADLINE_INTRO.split()), '\n'.join(table), plot]) + '\n'

def plot(path: Path, latest: Path = LATEST):
    "The headline's leads as bars, on a log scale around 1 (ahead to the right)."
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows = headline_rows(latest)[::-1]
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(rows) + 1.3))
    short = lambda m: m.split(' (median')[0].split(' (one round')[0].split(': the highest')[0][:72]
    labels = [f"{short(r['measure'])} vs {r['peer'].split(' (')[0]}, {r['machine']}" for r in rows]
    ax.barh(range(len(rows)), [r['lead'] for r in rows], color=['#2a7' if r['lead'] >= 1 else '#c44' for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.axvline(1, color='k', lw=1)
    ax.set_xscale('log')
    ticks = [0.5, 0.75, 1, 1.5, 2, 3, 4]
    ax.set_xticks(ticks, [f'{t:g}x' for t in ticks])
    ax.minorticks_off()
    ax.set_xlim(0.5, 4.5)
    ax.set_xlabel("nanoserve's lead over the peer (right of 1x: ahead)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={'Software': None})
    plt.close(fig)

def cited_files(latest: Path = LATEST) -> list[Path]:
    "Every file the section and the page read."
    return [latest/f['folder']/name for f in FAMILIES for _, name in f['runs']]

def readme_section(text: str) -> str:
    "The README's performance section: from its heading up to the blank line before the next section of the same level."
    start = text.index(HEADING + '\n')
    end = text.find('\n## ', start + len(HEADING))
    return (text[start:] if end < 0 else text[start:end]).rstrip('\n') + '\n'


PAGE_TITLE = """# Performance, machine by machine

> Every committed run of nanoserve beside its peers, one dated table per machine, written by `bench/performance.py`."""

def write(root: Path = ROOT):
    """Put the section into the notebooks' performance cells and into README.md (as `make readme` would), its plot into
    nbs/performance.png, and the page of every machine's tables into nbs/performance.ipynb."""
    latest = root/'bench'/'results'/'latest'
    section = render(latest)
    page = {'cells': [{'cell_type': 'markdown', 'id': 'title', 'metadata': {}, 'source': PAGE_TITLE.splitlines(True)},
                      {'cell_type': 'markdown', 'id': CELL_ID, 'metadata': {},
                       'source': render_page(latest).rstrip('\n').splitlines(keepends=True)}],
            'metadata': {'kernelspec': {'display_name': 'python3', 'language': 'python', 'name': 'python3'}},
            'nbformat': 4, 'nbformat_minor': 5}
    (root/PAGE).write_text(json.dumps(page, indent=1, ensure_ascii=False) + '\n')
    plot(root/PLOT, latest)
    for name in NOTEBOOKS:
        path = root/name
        nb = json.loads(path.read_text())
        cell = next(c for c in nb['cells'] if c.get('id') == CELL_ID)
        cell['source'] = section.rstrip('\n').splitlines(keepends=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    readme = (root/'README.md').read_text()
    (root/'README.md').write_text(readme.replace(readme_section(readme), for_readme(section)))

def for_readme(text: str) -> str:
    "The links and pictures of the landing page as the README has them, one folder up (the Makefile's readme rule)."
    return re.sub(r'\]\(([0-9][0-9]_[a-z0-9_]+\.ipynb|performance\.ipynb|[a-z0-9_]+\.png)\)', r'](nbs/\1)', text)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--write', action='store_true', help='write the section, its plot and the page')
    p.add_argument('--page', action='store_true', help="print the page of every machine's tables")
    a = p.parse_args()
    if a.write: write()
    else: print(render_page() if a.page else render(), end='')
