#!/usr/bin/env python
"""Random checkpoints of real mixture-of-experts shapes, with the default model's tokenizer: for speed and memory,
which do not depend on the weights' values.

    python bench/moe_checkpoint.py olmoe-1b-7b /tmp/olmoe-shape
    python bench/moe_checkpoint.py qwen3-30b-a3b /tmp/qwen3-30b-shape --layers 12
    python bench/moe_checkpoint.py qwen3-30b-a3b /tmp/qwen3-30b-full --zero-experts

Shapes (from the models' config.json): OLMoE-1B-7B-0924 (hidden 2048, 16 layers, 16 heads, 64 experts of 1024, top 8,
vocabulary 50,304; 6.9B parameters, 1.3B active) and Qwen3-30B-A3B (hidden 2048, 48 layers, 32 heads of 128, 4 KV heads,
128 experts of 768, top 8 scaled to one, vocabulary 151,936; 30.5B parameters, 3.3B active). `--layers` keeps the
first N layers. Weights are bfloat16 from N(0, 0.02), norms 1, one safetensors file a layer (written a tensor at a
time, so the writer holds one layer) and an index. With `--zero-experts` the experts' weights are left as holes in the
files (zeros that take no disk): a full-depth Qwen3-30B-A3B is 61 GB in bfloat16, more than this machine's free disk;
a reader reads its zeros like any bytes, so load time and peak memory are measured as they would be (the products'
speed does not depend on the values either), but routing is then decided by the router alone."""
import argparse, json, shutil
from pathlib import Path
import torch

SHAPES = {
    'olmoe-1b-7b': dict(architectures=['OlmoeForCausalLM'], model_type='olmoe', vocab_size=50304, hidden_size=2048,
                        intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                        max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5, num_experts=64,
                        num_experts_per_tok=8, norm_topk_prob=False, clip_qkv=None, tie_word_embeddings=False),
    'qwen3-30b-a3b': dict(architectures=['Qwen3MoeForCausalLM'], model_type='qwen3_moe', vocab_size=151936,
                          hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, max_position_embeddings=40960,
                          rope_theta=1000000.0, rms_norm_eps=1e-6, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)}
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.json', 'merges.txt',
                   'generation_config.json')


def layer_shapes(cfg: dict, i: int) -> dict[str, tuple[int, ...]]:
    "The tensors of decoder layer i and their shapes."
    h, d = cfg['hidden_size'], cfg.get('head_dim') or cfg['hidden_size'] // cfg['num_attention_heads']
    q, kv = cfg['num_attention_heads'] * d, cfg['num_key_value_heads'] * d
    inter, p = cfg.get('moe_intermediate_size') or cfg['intermediate_size'], f'model.layers.{i}.'
    olmoe = cfg['model_type'] == 'olmoe'
    out = {p + 'self_attn.q_proj.weight': (q, h), p + 'self_attn.k_proj.weight': (kv, h),
           p + 'self_attn.v_proj.weight': (kv, h), p + 'self_attn.o_proj.weight': (h, q),
           p + 'self_attn.q_norm.weight': (q if olmoe else d,), p + 'self_attn.k_norm.weight': (kv if olmoe else d,),
           p + 'input_layernorm.weight': (h,), p + 'post_attention_layernorm.weight': (h,),
           p + 'mlp.gate.weight': (cfg['num_experts'], h)}
    for e in range(cfg['num_experts']):
        out |= {p + f'mlp.experts.{e}.gate_proj.weight': (inter, h), p + f'mlp.experts.{e}.up_proj.weight': (inter, h),
                p + f'mlp.experts.{e}.down_proj.weight': (h, inter)}
    return out


def write_shard(path: Path, shapes: dict[str, tuple[int, ...]], g: torch.Generator, zero_experts: bool) -> int:
    """One safetensors file of bfloat16 tensors, written a tensor at a time; an expert's weight left as a hole (zeros)
    with `zero_experts`. Returns its parameters."""
    header, at = {}, 0
    for name, shape in shapes.items():
        n = 2 * torch.Size(shape).numel()
        header[name] = {'dtype': 'BF16', 'shape': list(shape), 'data_offsets': [at, at + n]}
        at += n
    header['__metadata__'] = {'format': 'pt'}
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(len(text).to_bytes(8, 'little'))
        f.write(text)
        start = f.tell()
        for name, shape in shapes.items():
            if zero_experts and '.experts.' in name: continue
            if name.endswith('norm.weight'): t = torch.ones(shape, dtype=torch.bfloat16)
            else: t = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
            f.seek(start + header[name]['data_offsets'][0])
            f.write(t.view(-1).view(torch.uint8).numpy().tobytes())
        f.truncate(start + at)
    return sum(torch.Size(s).numel() for s in shapes.values())


def write_checkpoint(shape: str, out: Path, layers: int | None = None, zero_experts: bool = False, seed: int = 0):
    from nanoserve.pull import pull
    src = pull()
    cfg = dict(SHAPES[shape], torch_dtype='bfloat16', hidden_act='silu', bos_token_id=None, eos_token_id=2,
               _name_or_path=f'random {shape} shape')
    cfg['num_hidden_layers'] = layers or cfg['num_hidden_layers']
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    h, v = cfg['hidden_size'], cfg['vocab_size']
    shards = [({'model.embed_tokens.weight': (v, h), 'model.norm.weight': (h,), 'lm_head.weight': (v, h)}, 'outer')]
    shards += [(layer_shapes(cfg, i), f'layer{i:02d}') for i in range(cfg['num_hidden_layers'])]
    weight_map, params = {}, 0
    for shapes, tag in shards:
        name = f'model-{tag}.safetensors'
        params += write_shard(out/name, shapes, g, zero_experts)
        weight_map |= {n: name for n in shapes}
        print(f'  {name}', flush=True)
    (out/'model.safetensors.index.json').write_text(json.dumps({'metadata': {}, 'weight_map': weight_map}))
    (out/'config.json').write_text(json.dumps(cfg, indent=2))
    for f in TOKENIZER_FILES:
        if (src/f).exists(): shutil.copy(src/f, out/f)
    print(f"wrote {out}: {params / 1e9:.2f}B parameters, {params * 2 / 2**30:.2f} GiB in bfloat16"
          f"{' (experts as holes)' * zero_experts}")


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('shape', choices=sorted(SHAPES))
    p.add_argument('out', type=Path)
    p.add_argument('--layers', type=int, default=None, help='keep the first N decoder layers')
    p.add_argument('--zero-experts', action='store_true', help="leave the experts' weights as holes (zeros)")
    p.add_argument('--seed', type=int, default=0)
    a = p.parse_args()
    write_checkpoint(a.shape, a.out, a.layers, a.zero_experts, a.seed)
