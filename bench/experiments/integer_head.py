#!/usr/bin/env python
"""What the LM head in w8a8 would cost in quality: the default model in w8a8 with its head in bfloat16 (the mode as
shipped) and in w8a8 too (`quantize_head`), perplexity and mean KL against float32 over the first --tokens tokens of the
held-out text (`nanoserve.quality`'s scoring, windows of 1,024); bench/integer.py's `w8a8+head` row measures its speed.

    python bench/experiments/integer_head.py --out bench/results/integer/head_quality.txt
"""
import argparse
from pathlib import Path
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.offline_bench import machine
from nanoserve.pull import resolve_model
from nanoserve.quality import held_out_text, score
from nanoserve.quant import quantize_model, quantize_head, W8A8Linear

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default='bench/results/integer/head_quality.txt')
    p.add_argument('--tokens', type=int, default=16384)
    args = p.parse_args()
    path, cfg = resolve_model(None), dict(max_model_len=1024)
    with_head = lambda model, mode, group: quantize_head(quantize_model(model, mode, group), mode)
    engines = {'float32': build_engine(path, EngineConfig(dtype='float32', **cfg)),
               'w8a8': build_engine(path, EngineConfig(quantization='w8a8', **cfg)),
               'w8a8, LM head in w8a8': build_engine(path, EngineConfig(quantization='w8a8', **cfg), quantize=with_head)}
    head = engines['w8a8, LM head in w8a8'].model.lm_head
    assert isinstance(head, W8A8Linear)
    ids = engines['float32'].tokenizer.encode(held_out_text(), add_special_tokens=False)[:args.tokens]
    s = score(engines, 'float32', ids, 1024)
    lines = [f"machine: {machine()}", f"command: python bench/experiments/integer_head.py --out {args.out} --tokens "
             f"{args.tokens}", f"the default model, {len(ids):,} tokens of the held-out text against float32; the head's "
             f"w8a8 copy: {head.w8.numel() / 2**20:.1f} MiB", f"{'mode':<26}{'perplexity':>12}{'vs float32':>12}{'mean KL':>10}"]
    for name, v in s.items():
        lines.append(f"{name:<26}{v.perplexity:>12.4f}{v.perplexity / s['float32'].perplexity - 1:>+12.2%}{v.kl_mean:>10.5f}")
    Path(args.out).write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))

if __name__ == '__main__': main()
