#!/usr/bin/env python
"""vLLM's pooling runner on CPU embedding texts offline, for bench/embeddings.py; run with vLLM's own venv's python.

    /work/peers/vllm/bin/python bench/peers/vllm_embed.py MODEL_DIR TEXTS.json OUT.npy --dtype bfloat16 --rounds 2

Loads `LLM(MODEL_DIR, runner='pooling')` (its pooling read from the same sentence-transformers files), warms on 8 texts,
then embeds every text --rounds times; prints one JSON line with each round's seconds, and saves the last round's vectors."""
import argparse, json, os, time
os.environ.setdefault('VLLM_CPU_KVCACHE_SPACE', '2')
os.environ.setdefault('VLLM_NO_USAGE_STATS', '1')
os.environ.setdefault('HF_HUB_OFFLINE', '1')

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('model')
    ap.add_argument('texts')
    ap.add_argument('out')
    ap.add_argument('--dtype', default='bfloat16')
    ap.add_argument('--rounds', type=int, default=2)
    args = ap.parse_args()
    import numpy as np
    from vllm import LLM
    texts = json.load(open(args.texts))
    llm = LLM(model=args.model, runner='pooling', dtype=args.dtype, max_model_len=1024, enforce_eager=True)
    llm.embed(texts[:8], use_tqdm=False)
    seconds, vecs = [], None
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        outs = llm.embed(texts, use_tqdm=False)
        seconds.append(time.perf_counter() - t0)
        vecs = np.array([o.outputs.embedding for o in outs], dtype=np.float32)
    np.save(args.out, vecs)
    print(json.dumps({'seconds': seconds}), flush=True)

if __name__ == '__main__': main()
