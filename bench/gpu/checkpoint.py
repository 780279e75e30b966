"""A random-weight checkpoint of a model's shape, for a GPU machine its weights cannot travel to: the model's
config.json and tokenizer files from SRC, weights drawn with transformers' own initialisation (seeded), saved as
safetensors in DST.

Random weights decode at the speed of real ones, but their logits are nearly flat: near-ties everywhere, so two
kernels that round differently flip greedy tokens, and an answers check between two arms (eager against a recorded
decode) fails for numerics, not for a bug. `--scale S` multiplies the final norm's weight by S, which multiplies every
logit by S: the same ranking, margins S times wider, so only a real difference flips a token.

    python bench/gpu/checkpoint.py SRC DST [--dtype bfloat16] [--scale 16] [--seed 0] [--shape qwen3-0.6b] [--dry-run]

`--shape qwen3-0.6b`: Qwen3-0.6B's shape (the model nano-vllm reports on: 28 layers, hidden 1,024, 16 query heads and
8 KV heads of 128, MLP 3,072, a vocabulary of 151,936, tied embeddings, q/k norms), with SRC's tokenizer; its token ids
reach past that tokenizer's vocabulary, which a speed run (token ids in, `ignore_eos`) never detokenizes. `--dry-run`:
the config and the parameter count (the model built on the meta device), nothing written.
"""
import argparse, json, shutil, sys
from pathlib import Path
import torch, transformers

TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'generation_config.json')
# Qwen3-0.6B's config.json fields (its published shape); the rest (special ids) stay SRC's
SHAPES = {'qwen3-0.6b': dict(architectures=['Qwen3ForCausalLM'], model_type='qwen3', hidden_size=1024,
                             intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                             head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                             rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, hidden_act='silu',
                             rope_scaling=None, sliding_window=None, use_sliding_window=False, max_window_layers=28)}

def shaped_config(src, shape: str | None = None):
    "SRC's config, or its special ids on `shape`'s architecture."
    if shape is None: return transformers.AutoConfig.from_pretrained(src)
    base = json.loads((Path(src) / 'config.json').read_text())
    keep = {k: base[k] for k in ('bos_token_id', 'eos_token_id', 'pad_token_id') if k in base}
    fields = {**SHAPES[shape], **keep, 'torch_dtype': 'bfloat16'}
    return transformers.AutoConfig.for_model(fields.pop('model_type'), **fields)

def build(src, dst, dtype: str = 'bfloat16', scale: float = 1.0, seed: int = 0, shape: str | None = None,
          dry_run: bool = False) -> Path:
    "Write the checkpoint; return `dst` (with `dry_run`: print its shape and size, write nothing)."
    src, dst = Path(src), Path(dst)
    cfg = shaped_config(src, shape)
    if dry_run:
        with torch.device('meta'): model = transformers.AutoModelForCausalLM.from_config(cfg)
        params = sum(p.numel() for p in model.parameters())
        print(f"would write {dst}: {cfg.model_type}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
              f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, vocab {cfg.vocab_size}: "
              f"{params / 1e6:.0f}M parameters, {params * 2 / 2**30:.2f} GiB in {dtype}")
        return dst
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad(): model.model.norm.weight.mul_(scale)
    model.to(getattr(torch, dtype)).save_pretrained(dst)
    for name in TOKENIZER_FILES:
        if (src / name).exists(): shutil.copy(src / name, dst / name)
    made = {'source': str(src), 'dtype': dtype, 'scale': scale, 'seed': seed, 'shape': shape}
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
    p.add_argument('--shape', choices=sorted(SHAPES), help="another model's shape, SRC's tokenizer")
    p.add_argument('--dry-run', action='store_true', help='print the shape and size; write nothing')
    a = p.parse_args(argv)
    print(build(a.src, a.dst, a.dtype, a.scale, a.seed, a.shape, a.dry_run))
    return 0

if __name__ == '__main__': sys.exit(main())
