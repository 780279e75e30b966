#!/usr/bin/env python
"""nanoserve and OpenVINO GenAI on the same prompts in one run: batch 1 and all prompts at once, rounds alternating.

    python bench/peers/openvino_side_by_side.py                   # 32 prompts of 40 tokens, 128 greedy tokens, 2 rounds
    python bench/peers/openvino_side_by_side.py --repeats 5 --out DIR
    python bench/peers/openvino_side_by_side.py --quantization int4 --name openvino_int4     # nanoserve's int4 weights

The prompts are random token ids past the tokenizer's special tokens (seeded), handed to both engines as ids: no chat
template, no tokenizer round trip. nanoserve runs in this process, built as `nanoserve bench offline` builds it
(`build_engine` with the default engine flags, --dtype, the prefix cache off): batch 1 is the first --batch1-prompts
prompts through an engine of one cache row, then all the prompts through one of as many rows; greedy, ignore_eos,
--max-tokens new tokens each; each engine warmed once on the prompts (a few tokens) before it is timed. OpenVINO GenAI
runs in a subprocess with the Python of --openvino-venv (bench/peers/install_openvino.sh) through
bench/peers/openvino_peer.py: LLMPipeline for batch 1, ContinuousBatchingPipeline for all the prompts at once, on an IR
exported with optimum-cli on first use into --ir (default ~/.cache/nanoserve/openvino/<model>-<weight format>). Both get
--threads threads (torch's for nanoserve, INFERENCE_NUM_THREADS for OpenVINO); neither is pinned. Each round runs both
engines, the order flipped from one round to the next, so a machine's drift falls on both alike.

Writes OUT/NAME.csv (NAME: --name, default openvino; a row per engine, round and batch) and OUT/NAME.txt (the
machine, the versions, the command, every round, the medians and nanoserve's ratio to OpenVINO at each batch, and how
many greedy continuations the two engines agree on). Not part of CI.
"""
import argparse, json, os, shlex, statistics, subprocess, sys, time
from pathlib import Path
import torch
from nanoserve.pull import resolve_model
from nanoserve.launch import build_engine
from nanoserve.engine import EngineConfig
from nanoserve.sampling import SamplingParams
from nanoserve.offline_bench import write_csv, machine
from nanoserve.core import cache_dir

HERE = Path(__file__).resolve().parent
PEER = HERE/'openvino_peer.py'

def make_prompts(model_dir: Path, num: int, length: int, seed: int) -> list[list[int]]:
    "Random token ids above the tokenizer's special tokens, seeded (make_workload's draw with its lower bound raised)."
    added = json.loads((model_dir/'tokenizer.json').read_text()).get('added_tokens', [])
    low = 1 + max((t['id'] for t in added if t.get('special')), default=-1)
    vocab = json.loads((model_dir/'config.json').read_text())['vocab_size']
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(low, vocab, (length,), generator=g).tolist() for _ in range(num)]

def timed_generate(engine, prompts: list[list[int]], max_tokens: int) -> dict:
    """One generate call over the prompts (the engine's cache rows bound how many run at once), after a warm-up call
    on the same prompts (a few tokens; the prefix cache is off, so nothing carries over)."""
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    secs = time.perf_counter() - t0
    tokens = [list(o.token_ids) for o in outs]
    n = sum(map(len, tokens))
    assert n == len(prompts) * max_tokens, f"nanoserve made {n} tokens, {len(prompts) * max_tokens} asked for"
    return {'prompts': len(prompts), 'output_tokens': n, 'seconds': secs, 'output_tok_s': n / secs, 'token_ids': tokens}

def run_nanoserve(path: Path, prompts: list[list[int]], a) -> dict:
    "Batch 1, then all the prompts at once, each on an engine built as `bench offline` builds it."
    base = dict(dtype=a.dtype, prefix_cache=False, quantization=a.quantization)
    t0 = time.perf_counter()
    engine = build_engine(path, EngineConfig(**base, max_batch_size=len(prompts)))
    load = time.perf_counter() - t0
    out = {'load_seconds': load, 'dtype': str(engine.model.dtype).removeprefix('torch.')}
    if a.batch1_prompts:
        one = build_engine(engine.model, EngineConfig(**base, max_batch_size=1), engine.tokenizer)
        out['batch1'] = timed_generate(one, prompts[:a.batch1_prompts], a.max_tokens)
        one.close()
        one = None
    out['batch'] = timed_generate(engine, prompts, a.max_tokens)
    engine.close()
    return out

def ensure_ir(python: Path, model: Path, ir: Path, weight_format: str) -> dict | None:
    "Export the IR with optimum-cli unless it is there already; what the export said, or None when cached."
    if (ir/'openvino_model.xml').exists(): return None
    print(f"exporting {model} to {ir} ({weight_format}) with optimum-cli", file=sys.stderr, flush=True)
    ir.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([str(python), str(PEER), 'export', str(model), str(ir), '--weight-format', weight_format],
                       stdout=subprocess.PIPE, text=True, timeout=1800)
    if r.returncode: sys.exit(f"optimum-cli's export failed (exit {r.returncode}); its log is above")
    return json.loads(r.stdout.splitlines()[-1])

def run_openvino(python: Path, ir: Path, prompts_json: Path, a) -> dict:
    "The peer's batch 1 and all-at-once runs, in a subprocess with the venv's Python."
    cmd = [str(python), str(PEER), 'run', str(ir), str(prompts_json), '--max-tokens', str(a.max_tokens),
           '--batch1-prompts', str(a.batch1_prompts), '--threads', str(a.threads), '--precision', a.ov_precision,
           '--kv-cache-precision', a.ov_kv_cache_precision]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode: raise RuntimeError(f"the OpenVINO peer failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.splitlines()[-1])

def agreement(a: list[list[int]], b: list[list[int]]) -> str:
    "How many greedy continuations are identical, and where the others first differ (median)."
    first = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), None) for p, q in zip(a, b)]
    differ = sorted(f for f in first if f is not None)
    tail = f", the others first differ at token {differ[len(differ) // 2]} (median)" if differ else ''
    return f"{len(a) - len(differ)}/{len(a)} identical{tail}"

def nanoserve_version() -> str:
    "nanoserve's version and the checkout's commit."
    import nanoserve
    git = ['git', '-C', str(HERE), 'rev-parse', '--short', 'HEAD']
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    return f"nanoserve {nanoserve.__version__}" + (f" ({commit})" if commit else '')

def report(rows: list[dict], a, header: list[str]) -> list[str]:
    "Every round, then each engine's median per batch and nanoserve's ratio to OpenVINO."
    lines = header + ['', f"{'round':>5}  {'engine':<32}{'batch':>6}{'prompts':>8}{'out tokens':>11}{'seconds':>9}"
                          f"{'out tok/s':>11}{'load before':>13}"]
    for r in rows:
        lines.append(f"{r['round']:>5}  {r['engine']:<32}{r['batch']:>6}{r['prompts']:>8}{r['output_tokens']:>11}"
                     f"{r['seconds']:>9.2f}{r['output_tok_s']:>11.1f}{r['load_1m_before']:>13.2f}")
    lines += ['', f"medians of {a.repeats} round(s), output tok/s:"]
    for batch, label in ((1, 'batch 1'), (a.num_prompts, f"{a.num_prompts} prompts at once")):
        med = {}
        for kind in ('nanoserve', 'openvino'):
            rates = [r['output_tok_s'] for r in rows if r['kind'] == kind and r['batch'] == batch]
            if rates: med[kind] = statistics.median(rates)
        if len(med) < 2: continue
        per_round = [n['output_tok_s'] / o['output_tok_s'] for n in rows for o in rows
                     if n['kind'] == 'nanoserve' and o['kind'] == 'openvino' and n['batch'] == o['batch'] == batch
                     and n['round'] == o['round']]
        lines.append(f"  {label:<22} nanoserve {med['nanoserve']:8.1f}   OpenVINO GenAI {med['openvino']:8.1f}   "
                     f"nanoserve/OpenVINO {med['nanoserve'] / med['openvino']:.2f}x "
                     f"(rounds: {', '.join(f'{x:.2f}' for x in per_round)})")
    return lines

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None, help="a checkpoint directory (default: the default model, pulled)")
    p.add_argument('--openvino-venv', default='/work/peers/openvino',
                   help='the venv bench/peers/install_openvino.sh made (default /work/peers/openvino)')
    p.add_argument('--ir', default=None, help='the OpenVINO IR directory (default: ~/.cache/nanoserve/openvino/'
                   '<model>-<weight format>, exported on first use)')
    p.add_argument('--weight-format', default='fp16', help="the IR's weights: fp16 (default), fp32, int8")
    p.add_argument('--dtype', default='bfloat16', help="nanoserve's dtype (default bfloat16)")
    p.add_argument('--quantization', default='none', help="nanoserve's weights: none (default), int8 or int4")
    p.add_argument('--name', default='openvino', help='the files written: OUT/NAME.csv and .txt')
    p.add_argument('--ov-precision', default='bf16', help="OpenVINO's INFERENCE_PRECISION_HINT (default bf16)")
    p.add_argument('--ov-kv-cache-precision', default='default',
                   help="OpenVINO's KV_CACHE_PRECISION (default: the plugin's choice, which it reports)")
    p.add_argument('--num-prompts', type=int, default=32)
    p.add_argument('--prompt-len', type=int, default=40)
    p.add_argument('--max-tokens', type=int, default=128)
    p.add_argument('--batch1-prompts', type=int, default=4, help='prompts run one at a time (0: skip batch 1)')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--repeats', type=int, default=2, help='rounds of both engines, the order flipped each round')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default='bench/results/peers/openvino')
    a = p.parse_args()
    torch.set_num_threads(a.threads)    # nanoserve's kernels take their thread count from torch
    say = lambda m: print(m, file=sys.stderr, flush=True)
    path = Path(resolve_model(a.model, log=say))
    python = Path(a.openvino_venv)/'bin'/'python'
    if not python.is_file(): sys.exit(f"no OpenVINO Python at {python}: run bench/peers/install_openvino.sh")
    ir = Path(a.ir) if a.ir else cache_dir()/'openvino'/f"{path.name}-{a.weight_format}"
    exported = ensure_ir(python, path, ir, a.weight_format)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = make_prompts(path, a.num_prompts, a.prompt_len, a.seed)
    prompts_json = out/'prompts.json'
    prompts_json.write_text(json.dumps(prompts))
    rows, peer, mine, ns_version = [], None, None, nanoserve_version()
    for rnd in range(1, a.repeats + 1):
        order = ('nanoserve', 'openvino') if rnd % 2 else ('openvino', 'nanoserve')
        for kind in order:
            say(f"round {rnd} of {a.repeats}: {kind}")
            load = os.getloadavg()[0]    # a busy machine (other work on the cores) shows here
            res = run_nanoserve(path, prompts, a) if kind == 'nanoserve' else run_openvino(python, ir, prompts_json, a)
            if kind == 'nanoserve':
                mine = res
                engine = f"{ns_version.split(' (')[0]} {res['dtype']}"
            else:
                peer = res
                engine = f"{res['engine']} {res['inference_precision_hint']}"
            done = len(rows)
            for key, batch in (('batch1', 1), ('batch', a.num_prompts)):
                if key not in res: continue
                r = res[key]
                rows.append({'round': rnd, 'kind': kind, 'engine': engine, 'weights': a.quantization if kind ==
                             'nanoserve' else a.weight_format, 'batch': batch, 'prompts': r['prompts'],
                             'prompt_len': a.prompt_len, 'output_tokens': r['output_tokens'],
                             'seconds': round(r['seconds'], 3), 'output_tok_s': round(r['output_tok_s'], 2),
                             'threads': a.threads, 'load_1m_before': round(load, 2)})
            say('  ' + ', '.join(f"batch {r['batch']}: {r['output_tok_s']:.1f} tok/s" for r in rows[done:]))
    command = ' '.join(shlex.quote(x) for x in [Path(sys.executable).name] + sys.argv)
    where = machine()
    for r in rows:
        r.update(machine=where, command=command)
    write_csv(rows, out/f'{a.name}.csv')
    versions = (f"versions: {ns_version}, torch {torch.__version__}; {peer['engine']} ({peer['openvino_genai']}), "
                f"openvino {peer['openvino']}")
    default = (peer['plugin_default_inference_precision_hint'], peer['plugin_default_kv_cache_precision'])
    exported_note = f", exported in {exported['export_seconds']} s this run" if exported else ''
    precisions = (f"OpenVINO: CPU, INFERENCE_NUM_THREADS {peer['inference_num_threads']}, "
                  f"INFERENCE_PRECISION_HINT {peer['inference_precision_hint']} (plugin default {default[0]}), "
                  f"KV_CACHE_PRECISION {peer['kv_cache_precision']} (plugin default {default[1]}); "
                  f"IR {ir} ({a.weight_format} weights{exported_note})")
    sched = peer.get('batch', {}).get('scheduler')
    header = [f"machine: {where}", versions, f"command: {command}",
              f"{a.num_prompts} prompts of {a.prompt_len} random token ids (seed {a.seed}), {a.max_tokens} greedy "
              f"tokens each with ignore_eos; batch 1: the first {a.batch1_prompts} one at a time",
              f"nanoserve: {mine['dtype']}, weights {a.quantization}, prefix cache off, torch threads {a.threads}; "
              "engine build "
              f"{mine['load_seconds']:.1f} s", precisions]
    if sched: header.append(f"OpenVINO ContinuousBatchingPipeline scheduler: {json.dumps(sched)}")
    for key, label in (('batch1', 'batch 1'), ('batch', f"{a.num_prompts} prompts")):
        if key in mine and key in peer:
            header.append(f"greedy agreement ({label}, last round): "
                          f"{agreement(mine[key]['token_ids'], peer[key]['token_ids'])}")
    lines = report(rows, a, header)
    (out/f'{a.name}.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__': main()
