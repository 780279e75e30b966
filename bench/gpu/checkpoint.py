"""A random-weight checkpoint of a model's shape, for a GPU machine its weights cannot travel to: the model's
config.json and tokenizer files from SRC, weights drawn with transformers' own initialisation (seeded), saved as
safetensors in DST.

Random weights decode at the speed of real ones, but their logits are nearly flat: near-ties everywhere, so two
kernels that round differently flip greedy tokens, and an answers check between two arms (eager against a recorded
decode) fails for numerics, not for a bug. `--scale S` multiplies the final norm's weight by S, which multiplies every
logit by S: the same ranking, margins S times wider, so only a real difference flips a token.

    python bench/gpu/checkpoint.py SRC DST [--dtype bfloat16] [--scale 16] [--seed 0]
"""
import argparse, json, shutil, sys
from pathlib import Path
import torch, transformers

TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'generation_config.json')

def build(src, dst, dtype: str = 'bfloat16', scale: float = 1.0, seed: int = 0) -> Path:
    "Write the checkpoint; return `dst`."
    src, dst = Path(src), Path(dst)
    cfg = transformers.AutoConfig.from_pretrained(src)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad(): model.model.norm.weight.mul_(scale)
    model.to(getattr(torch, dtype)).save_pretrained(dst)
    for name in TOKENIZER_FILES:
        if (src / name).exists(): shutil.copy(src / name, dst / name)
    made = {'source': str(src), 'dtype': dtype, 'scale': scale, 'seed': seed}
    (dst / 'random_weights.json').write_text(json.dumps(made))
    return dst

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('src')
    p.add_argument('dst')
    p.add_argument('--dtype', default='bfloat16', choices=['bfloat16', 'float32', 'float16'])
    p.add_argument('--scale', type=float, default=1.0,
                   help="the final norm's weight times this (logit margins this many times wider)")
    p.add_argument('--seed', type=int, default=0)
    a = p.parse_args(argv)
    print(build(a.src, a.dst, a.dtype, a.scale, a.seed))
    return 0

if __name__ == '__main__': sys.exit(main())
