#!/usr/bin/env python
"""A mixture-of-experts checkpoint (OLMoE or Qwen3-MoE, safetensors, bfloat16) as an F16 GGUF llama.cpp reads: the same
weights nanoserve serves, for its batch-1 comparison. Run with the Python of bench/peers/install_llamacpp.sh's venv
(numpy and gguf; no torch):

    PY=/work/peers/llamacpp/bin/python
    $PY bench/peers/moe_gguf.py /tmp/olmoe-shape /tmp/olmoe.F16.gguf --tokenizer-gguf SMOLLM2.gguf
    $PY bench/peers/llamacpp_peer.py quantize /tmp/olmoe.F16.gguf /tmp/olmoe.Q4_0.gguf Q4_0

The tokenizer's metadata (`tokenizer.ggml.*`) is copied from another GGUF with the same tokenizer (the default model's:
the checkpoints of bench/moe_checkpoint.py carry SmolLM2's). Each layer's experts are stacked into llama.cpp's three
[experts, out, in] tensors (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`); norms stay F32, everything else F16.
Tensors are written as they are read, a layer at a time, so the converter holds one layer's experts."""
import argparse, json
from pathlib import Path
import numpy as np
import gguf

ARCH = {'OlmoeForCausalLM': 'olmoe', 'Qwen3MoeForCausalLM': 'qwen3moe'}
ATTN = {'q_proj': 'attn_q', 'k_proj': 'attn_k', 'v_proj': 'attn_v', 'o_proj': 'attn_output', 'q_norm': 'attn_q_norm',
        'k_norm': 'attn_k_norm'}
EXPERT = {'gate_proj': 'ffn_gate_exps', 'up_proj': 'ffn_up_exps', 'down_proj': 'ffn_down_exps'}


class Checkpoint:
    "A safetensors checkpoint's tensors by name, read as float32 arrays (bfloat16 widened exactly)."
    def __init__(self, path: Path):
        idx = path/'model.safetensors.index.json'
        files = ['model.safetensors']
        if idx.exists(): files = sorted(set(json.loads(idx.read_text())['weight_map'].values()))
        self.where = {}
        for f in files:
            with open(path/f, 'rb') as fh:
                n = int.from_bytes(fh.read(8), 'little')
                header = json.loads(fh.read(n))
            for name, info in header.items():
                if name != '__metadata__': self.where[name] = (path/f, 8 + n, info)

    def shape(self, name: str) -> tuple[int, ...]: return tuple(self.where[name][2]['shape'])

    def read(self, name: str) -> np.ndarray:
        f, start, info = self.where[name]
        begin, end = info['data_offsets']
        raw = np.fromfile(f, dtype=np.uint8, count=end - begin, offset=start + begin)
        if info['dtype'] == 'BF16':
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(info['shape'])
        if info['dtype'] in ('F32', 'F16'):
            stored = np.float32 if info['dtype'] == 'F32' else np.float16
            return raw.view(stored).astype(np.float32).reshape(info['shape'])
        raise SystemExit(f"{name}: dtype {info['dtype']} is not converted here")


def plan(cfg: dict, ck: Checkpoint) -> list[tuple[str, tuple[int, ...], type, object]]:
    "(GGUF name, numpy shape, dtype, how to read it) for every tensor, in the order they are written."
    out = [('token_embd.weight', ck.shape('model.embed_tokens.weight'), np.float16, 'model.embed_tokens.weight')]
    for i in range(cfg['num_hidden_layers']):
        p = f'model.layers.{i}.'
        out.append((f'blk.{i}.attn_norm.weight', ck.shape(p + 'input_layernorm.weight'), np.float32,
                    p + 'input_layernorm.weight'))
        for hf, name in ATTN.items():
            src = p + f'self_attn.{hf}.weight'
            out.append((f'blk.{i}.{name}.weight', ck.shape(src), np.float32 if 'norm' in hf else np.float16, src))
        out.append((f'blk.{i}.ffn_norm.weight', ck.shape(p + 'post_attention_layernorm.weight'), np.float32,
                    p + 'post_attention_layernorm.weight'))
        out.append((f'blk.{i}.ffn_gate_inp.weight', ck.shape(p + 'mlp.gate.weight'), np.float32, p + 'mlp.gate.weight'))
        for hf, name in EXPERT.items():
            srcs = [p + f'mlp.experts.{e}.{hf}.weight' for e in range(cfg['num_experts'])]
            out.append((f'blk.{i}.{name}.weight', (len(srcs), *ck.shape(srcs[0])), np.float16, srcs))
    out.append(('output_norm.weight', ck.shape('model.norm.weight'), np.float32, 'model.norm.weight'))
    out.append(('output.weight', ck.shape('lm_head.weight'), np.float16, 'lm_head.weight'))
    return out


def convert(src: Path, dst: Path, tokenizer_gguf: Path):
    cfg = json.loads((src/'config.json').read_text())
    arch = ARCH[cfg['architectures'][0]]
    ck = Checkpoint(src)
    w = gguf.GGUFWriter(str(dst), arch)
    heads = cfg['num_attention_heads']
    w.add_context_length(cfg['max_position_embeddings'])
    w.add_embedding_length(cfg['hidden_size'])
    w.add_block_count(cfg['num_hidden_layers'])
    w.add_feed_forward_length(cfg['intermediate_size'])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg['num_key_value_heads'])
    if cfg.get('head_dim'):
        w.add_key_length(cfg['head_dim'])
        w.add_value_length(cfg['head_dim'])
    w.add_rope_freq_base(cfg.get('rope_theta') or cfg['rope_parameters']['rope_theta'])    # transformers 4's, or 5's
    w.add_layer_norm_rms_eps(cfg['rms_norm_eps'])
    w.add_expert_count(cfg['num_experts'])
    w.add_expert_used_count(cfg['num_experts_per_tok'])
    if cfg.get('moe_intermediate_size'): w.add_expert_feed_forward_length(cfg['moe_intermediate_size'])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    r = gguf.GGUFReader(str(tokenizer_gguf))
    for name, f in r.fields.items():
        if not name.startswith('tokenizer.'): continue
        vtype, value = f.types[0], f.contents()
        # llama.cpp wants a token a row of the embedding: the rows past the tokenizer's are named, as control tokens
        pad = cfg['vocab_size'] - len(r.fields['tokenizer.ggml.tokens'].contents())
        if name == 'tokenizer.ggml.tokens': value = value + [f'<|unused{i}|>' for i in range(pad)]
        if name == 'tokenizer.ggml.token_type': value = value + [int(gguf.TokenType.CONTROL)] * pad
        if name == 'tokenizer.ggml.scores': value = value + [0.0] * pad
        if vtype == gguf.GGUFValueType.ARRAY: w.add_key_value(name, value, vtype, sub_type=f.types[-1])
        else: w.add_key_value(name, value, vtype)
    tensors = plan(cfg, ck)
    for name, shape, dtype, _ in tensors:
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, dtype, how in tensors:
        a = np.stack([ck.read(s) for s in how]) if isinstance(how, list) else ck.read(how)
        w.write_tensor_data(np.ascontiguousarray(a.astype(dtype)).reshape(shape))
    w.close()
    print(f"wrote {dst}: {len(tensors)} tensors, {dst.stat().st_size / 1e9:.2f} GB")


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('src', type=Path)
    p.add_argument('dst', type=Path)
    p.add_argument('--tokenizer-gguf', type=Path, required=True)
    a = p.parse_args()
    convert(a.src, a.dst, a.tokenizer_gguf)
