"""Issue 2's report: pull time, model size on disk, and batch-1 greedy decode speed of nanoserve's reference
generate beside transformers' generate, float32 and bfloat16, measured in one run on this machine.

Usage: python bench/reference_generate.py [--tokens 128] [--repeats 3] [--out bench/results/reference_generate.csv]
Prints a table and writes a CSV. Nothing here asserts a time.
"""
import argparse, csv, os, platform, tempfile, time
from pathlib import Path
import torch, transformers

def timed_pull():
    "Pull into a fresh, empty cache (download included), then return (seconds, directory, bytes on disk)."
    from nanoserve.pull import pull, dir_bytes
    with tempfile.TemporaryDirectory() as d:
        os.environ['NANOSERVE_CACHE'] = d
        t0 = time.perf_counter(); path = pull(log=lambda m: None); secs = time.perf_counter() - t0
        size = dir_bytes(path)
    del os.environ['NANOSERVE_CACHE']
    return secs, size

def bench(fn, repeats):
    fn(8)                                             # warm-up: allocator, kernels, caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(None); times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]             # median

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--tokens', type=int, default=128)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--out', default='bench/results/reference_generate.csv')
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    from nanoserve.pull import pull
    from nanoserve.generate import ReferenceLM, SampleSpec, generate_ids
    pull_s, size = timed_pull()
    path = pull(log=lambda m: None)
    chat = [{'role': 'user', 'content': 'Tell me a long story about a robot who learns to paint.'}]
    rows = []
    for dtype in ('float32', 'bfloat16'):
        lm = ReferenceLM(path, dtype)
        ids = lm.prompt_ids(chat)
        n = args.tokens
        ours = bench(lambda k: generate_ids(lm.model, ids, SampleSpec(max_tokens=k or n)), args.repeats)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        x = torch.tensor([ids])
        def hf_gen(k):
            with torch.inference_mode():
                hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=k or n, min_new_tokens=k or n,
                            do_sample=False, eos_token_id=None, pad_token_id=2)
        theirs = bench(hf_gen, args.repeats)
        for engine, secs in (('nanoserve reference', ours), ('transformers.generate', theirs)):
            rows.append({'engine': engine, 'dtype': dtype, 'batch': 1, 'prompt_tokens': len(ids), 'new_tokens': n,
                         'seconds': round(secs, 3), 'tokens_per_s': round(n / secs, 1)})
        del lm, hf
    out = Path(args.out); out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"pull (fresh cache, download included): {pull_s:.1f} s; model on disk: {size / 1e6:.1f} MB")
    print(f"{'engine':<24}{'dtype':<10}{'tok/s':>8}{'seconds':>9}")
    for r in rows: print(f"{r['engine']:<24}{r['dtype']:<10}{r['tokens_per_s']:>8}{r['seconds']:>9}")
    for dtype in ('float32', 'bfloat16'):
        a, b = (next(r['tokens_per_s'] for r in rows if r['engine'] == e and r['dtype'] == dtype)
                for e in ('nanoserve reference', 'transformers.generate'))
        print(f"{dtype}: nanoserve reference / transformers = {a / b:.2f}x")
    print(f"wrote {out}")

if __name__ == '__main__':
    main()
