#!/usr/bin/env python
"""A random checkpoint of a real model's shape, with the default model's tokenizer: for speed, which does not depend on
the weights' values.

    python bench/shaped_checkpoint.py 1.7B /tmp/smollm2-1.7b-shape
    python bench/shaped_checkpoint.py 360M /tmp/smollm2-360m-shape

Shapes: SmolLM2-360M (hidden 960, 32 layers, 15 heads, 5 KV heads, MLP 2560) and SmolLM2-1.7B (hidden 2048, 24 layers,
32 heads, 32 KV heads, MLP 8192), both with tied embeddings, a vocabulary of 49,152 and SmolLM2's tokenizer, copied from
the pulled default model. Weights are bfloat16 drawn from N(0, 0.02) (norms 1), one safetensors file, written a
tensor at a time; a Llama config.json that transformers, vLLM and nanoserve read. The seed fixes the bits."""
import argparse, json, shutil
from pathlib import Path
import torch
from safetensors.torch import save_file

SHAPES = {'360M': dict(hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                       intermediate_size=2560),
          '1.7B': dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32,
                       intermediate_size=8192)}
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.json', 'merges.txt',
                   'generation_config.json')


def write_checkpoint(shape: str, out: Path, seed: int = 0) -> Path:
    from nanoserve.pull import pull
    src = pull()
    base = json.loads((src/'config.json').read_text())
    cfg = {**base, **SHAPES[shape], 'head_dim': SHAPES[shape]['hidden_size'] // SHAPES[shape]['num_attention_heads'],
           'tie_word_embeddings': True, 'torch_dtype': 'bfloat16', '_name_or_path': f'random SmolLM2-{shape} shape'}
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    h, inter, d = cfg['hidden_size'], cfg['intermediate_size'], cfg['head_dim']
    q, kv = cfg['num_attention_heads'] * d, cfg['num_key_value_heads'] * d
    rand = lambda *s: (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)
    tensors = {'model.embed_tokens.weight': rand(cfg['vocab_size'], h),
               'model.norm.weight': torch.ones(h, dtype=torch.bfloat16)}
    for i in range(cfg['num_hidden_layers']):
        p = f'model.layers.{i}.'
        tensors |= {p + 'self_attn.q_proj.weight': rand(q, h), p + 'self_attn.k_proj.weight': rand(kv, h),
                    p + 'self_attn.v_proj.weight': rand(kv, h), p + 'self_attn.o_proj.weight': rand(h, q),
                    p + 'mlp.gate_proj.weight': rand(inter, h), p + 'mlp.up_proj.weight': rand(inter, h),
                    p + 'mlp.down_proj.weight': rand(h, inter),
                    p + 'input_layernorm.weight': torch.ones(h, dtype=torch.bfloat16),
                    p + 'post_attention_layernorm.weight': torch.ones(h, dtype=torch.bfloat16)}
    save_file(tensors, str(out/'model.safetensors'), metadata={'format': 'pt'})
    (out/'config.json').write_text(json.dumps(cfg, indent=2))
    for f in TOKENIZER_FILES:
        if (src/f).exists(): shutil.copy(src/f, out/f)
    params = sum(t.numel() for t in tensors.values())
    print(f"wrote {out}: {params / 1e9:.2f}B parameters, {params * 2 / 2**30:.2f} GiB")
    return out


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('shape', choices=sorted(SHAPES))
    p.add_argument('out', type=Path)
    p.add_argument('--seed', type=int, default=0)
    a = p.parse_args()
    write_checkpoint(a.shape, a.out, a.seed)
