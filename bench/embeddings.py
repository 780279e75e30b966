#!/usr/bin/env python
"""Embeddings: nanoserve's pooling runner beside sentence-transformers' `encode` on the same checkpoint and machine, one run.

    python bench/embeddings.py --out bench/results/embeddings                      # Qwen3-Embedding-0.6B's shape
    python bench/embeddings.py --out bench/results/embeddings --shape smollm2-135m --rounds 3

The model is a random checkpoint of a real embedding model's shape, saved by sentence-transformers itself the way
Qwen3-Embedding is published (the bare decoder, modules.json, last-token pooling, Normalize), with SmolLM2's tokenizer
(vocabulary 49,152: the shape's own vocabulary only sizes the embedding table, which pooling never multiplies by).
The workload is 1,000 texts of 32 to 256 tokens (uniform), the same texts for both.

- sentence-transformers: `SentenceTransformer(dir).encode(texts, batch_size=32)` (it sorts by length, so a batch pads
  little), in float32 (its default) and in bfloat16 (`model_kwargs={'dtype': torch.bfloat16}`);
- nanoserve: the engine `nanoserve serve --runner pooling` builds (`build_engine`), every text queued at once and run
  to the end (`nanoserve.pooling.embed`), in bfloat16 (its default here) and float32.

Rounds alternate the arms; each arm's number is its median, with the spread. Both arms load before the clock starts,
and each warms on 8 texts first. The vectors are checked against each other (the same dtype's cosine) so a fast wrong
answer cannot pass. Writes OUT/embeddings.csv and OUT/embeddings.txt, naming the machine.
"""
import argparse, json, random, statistics, sys, tempfile, time
from pathlib import Path
import torch, transformers
from nanoserve.launch import build_engine
from nanoserve.pooling import embed
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import write_csv, machine

SHAPES = {  # name -> (architecture, config fields)
    'qwen3-embedding-0.6b': ('qwen3', dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                                           num_key_value_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6)),
    'smollm2-135m': ('llama', dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, rope_theta=1e5, rms_norm_eps=1e-5)),
}

def make_model(shape: str, out: Path) -> Path:
    "A random checkpoint of `shape` in sentence-transformers' layout, with SmolLM2's tokenizer."
    from sentence_transformers import SentenceTransformer, models
    arch, fields = SHAPES[shape]
    tok_dir = resolve_model(None)
    cfg = transformers.AutoConfig.for_model(arch, vocab_size=49152, max_position_embeddings=4096, tie_word_embeddings=True,
                                            **fields)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters(): p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    bare = out/'bare'
    model.save_pretrained(bare)
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    tok.pad_token = tok.pad_token or tok.eos_token
    # no chat template: sentence-transformers 6 would wrap each text in one as a chat message, and embed other tokens
    tok.chat_template = None
    tok.save_pretrained(bare)
    for f in bare.glob('chat_template*'): f.unlink()
    t = models.Transformer(str(bare))
    width = getattr(t, 'get_embedding_dimension', None) or t.get_word_embedding_dimension
    SentenceTransformer(modules=[t, models.Pooling(width(), pooling_mode='lasttoken'), models.Normalize()]).save(str(out/'st'))
    return out/'st'

def make_texts(path: Path, n: int, lo: int, hi: int, seed: int = 0) -> tuple[list[str], int]:
    "n texts whose token counts are uniform in [lo, hi] (made of the tokenizer's own words, so they tokenize back alike)."
    tok = transformers.AutoTokenizer.from_pretrained(path)
    rng, words = random.Random(seed), [w for w in tok.get_vocab() if w.isalpha() and w.startswith('Ġ')][:8000]
    texts = []
    for _ in range(n):
        want = rng.randint(lo, hi)
        texts.append(''.join(rng.choice(words) for _ in range(want)).replace('Ġ', ' ').strip())
    total = sum(len(tok(t)['input_ids']) for t in texts)
    return texts, total

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', default='bench/results/embeddings')
    ap.add_argument('--shape', default='qwen3-embedding-0.6b', choices=sorted(SHAPES))
    ap.add_argument('--texts', type=int, default=1000)
    ap.add_argument('--rounds', type=int, default=2)
    ap.add_argument('--arms', default='nanoserve-bfloat16,st-bfloat16,nanoserve-float32,st-float32')
    ap.add_argument('--vllm-venv', default=None, help="add vLLM's pooling runner (bench/peers/install_vllm.sh) in bfloat16, "
                                                      "run after the others (its own process, its own rounds)")
    args = ap.parse_args()
    from sentence_transformers import SentenceTransformer
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix='embbench'))
    path = make_model(args.shape, work)
    texts, total = make_texts(path, args.texts, 32, 256)
    print(f"{args.shape}: {len(texts)} texts, {total} tokens; {machine()}", flush=True)
    arms = args.arms.split(',')
    loaded = {}
    for arm in arms:
        kind, dtype = arm.split('-')
        if kind == 'st':
            st = SentenceTransformer(str(path), device='cpu', model_kwargs={'dtype': getattr(torch, dtype)})
            loaded[arm] = lambda x, st=st: torch.tensor(st.encode(x, batch_size=32, convert_to_numpy=True))
        else:
            eng = build_engine(path, runner='pooling', dtype=dtype)
            loaded[arm] = lambda x, eng=eng: embed(eng, x)
        loaded[arm](texts[:8])                      # warm
    times, vecs = {a: [] for a in arms}, {}
    for r in range(args.rounds):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            t0 = time.perf_counter()
            vecs[arm] = loaded[arm](texts)
            times[arm].append(time.perf_counter() - t0)
            print(f"round {r}: {arm}: {times[arm][-1]:.1f} s", flush=True)
    if args.vllm_venv:
        import subprocess, numpy as np
        (work/'texts.json').write_text(json.dumps(texts))
        for a in list(loaded): loaded.pop(a)           # the engines' memory back before vLLM loads
        run = subprocess.run([f'{args.vllm_venv}/bin/python', str(Path(__file__).parent/'peers'/'vllm_embed.py'), str(path),
                              str(work/'texts.json'), str(work/'vllm.npy'), '--dtype', 'bfloat16', '--rounds', str(args.rounds)],
                             capture_output=True, text=True)
        # its result line, after vLLM's own log; its exit status is not read: its shutdown ends in a C++ `terminate`
        line = next((x for x in run.stdout.splitlines()[::-1] if x.startswith('{"seconds"')), None)
        if line is not None:
            times['vllm-bfloat16'] = json.loads(line)['seconds']
            vecs['vllm-bfloat16'] = torch.from_numpy(np.load(work/'vllm.npy'))
            arms.append('vllm-bfloat16')
            print(f"vllm-bfloat16: {times['vllm-bfloat16']}", flush=True)
        else: print(f"vLLM's pooling runner did not run: {run.stderr[-2000:]}", flush=True)
    rows = []
    for arm in arms:
        kind, dtype = arm.split('-')
        twin = f"{'nanoserve' if kind != 'nanoserve' else 'st'}-{dtype}"
        cos = (float(torch.nn.functional.cosine_similarity(vecs[arm].float(), vecs[twin].float()).min())
               if twin in vecs else None)
        med = statistics.median(times[arm])
        rows.append({'shape': args.shape, 'arm': arm, 'texts': len(texts), 'tokens': total, 'rounds': args.rounds,
                     'seconds_median': round(med, 2), 'seconds_min': round(min(times[arm]), 2),
                     'seconds_max': round(max(times[arm]), 2), 'texts_per_s': round(len(texts) / med, 2),
                     'tokens_per_s': round(total / med, 1), 'min_cosine_vs_other': cos})
    for r in rows:
        for base in ('st-float32', 'st-bfloat16'):
            b = next((x for x in rows if x['arm'] == base), None)
            if b is not None: r[f'x_vs_{base}'] = round(b['seconds_median'] / r['seconds_median'], 2)
    name = f"embeddings_{args.shape}"
    write_csv(rows, out/f'{name}.csv')
    cmd = 'python bench/embeddings.py ' + ' '.join(sys.argv[1:])
    lines = [f"# {cmd}", f"# {machine()}", f"# {args.shape}: {len(texts)} texts, {total} tokens (32-256 each)",
             '| arm | median s (min-max) | texts/s | tokens/s | x vs ST float32 | x vs ST bfloat16 | min cosine vs other |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['arm']} | {r['seconds_median']} ({r['seconds_min']}-{r['seconds_max']}) | {r['texts_per_s']} | "
                     f"{r['tokens_per_s']} | {r.get('x_vs_st-float32', '')} | {r.get('x_vs_st-bfloat16', '')} | "
                     f"{r['min_cosine_vs_other'] if r['min_cosine_vs_other'] is None else round(r['min_cosine_vs_other'], 5)} |")
    (out/f'{name}.txt').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__': main()
