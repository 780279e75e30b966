#!/usr/bin/env python
"""OpenVINO GenAI as a peer, run with the Python of the venv bench/peers/install_openvino.sh made (never nanoserve's).

    PY=/work/peers/openvino/bin/python
    $PY bench/peers/openvino_peer.py export MODEL_DIR OUT_DIR [--weight-format fp16]   # optimum-cli's IR, ~45 s
    $PY bench/peers/openvino_peer.py run IR_DIR PROMPTS_JSON --max-tokens 128          # one JSON object on stdout

PROMPTS_JSON is a list of prompts as token-id lists: both pipelines take `input_ids` as an `ov.Tensor`, so the peer
sees the very tokens nanoserve does (no chat template, no tokenizer round trip). `run` measures batch 1 through
`LLMPipeline` (the first --batch1-prompts prompts one at a time; tok/s = generated tokens / the generate calls' wall
time) and all the prompts at once through `ContinuousBatchingPipeline` (tok/s = generated tokens / the call's wall
time), greedy with ignore_eos, on the CPU with --threads threads (`INFERENCE_NUM_THREADS`) and the inference precision
--precision (`INFERENCE_PRECISION_HINT`; OpenVINO's own default on a CPU with AVX512-BF16 or AMX is bf16). Each
pipeline is warmed once (every prompt, a few tokens) before it is timed. The JSON names the precisions the CPU plugin
reports for the model compiled with the same properties, and the generated token ids."""
import argparse, json, shutil, subprocess, sys, time
from pathlib import Path

def export(model: str, out: str, weight_format: str) -> dict:
    "optimum-cli's OpenVINO IR of a Hugging Face checkpoint directory, written beside OUT and renamed into place."
    out_dir = Path(out)
    part = out_dir.with_name(out_dir.name + '.partial')
    shutil.rmtree(part, ignore_errors=True)
    cli = Path(sys.executable).parent/'optimum-cli'
    cmd = [str(cli), 'export', 'openvino', '--model', model, '--task', 'text-generation-with-past',
           '--weight-format', weight_format, str(part)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=sys.stderr)    # stdout stays the JSON line's
    secs = time.perf_counter() - t0
    shutil.rmtree(out_dir, ignore_errors=True)
    part.rename(out_dir)
    return {'ir': str(out_dir), 'weight_format': weight_format, 'export_seconds': round(secs, 1), 'command': cmd}

def properties(threads: int, precision: str, kv_precision: str) -> dict:
    "The CPU plugin's properties both pipelines get."
    props = {'INFERENCE_NUM_THREADS': threads}
    if precision != 'default': props['INFERENCE_PRECISION_HINT'] = precision
    if kv_precision != 'default': props['KV_CACHE_PRECISION'] = kv_precision
    return props

def reported(ir: Path, props: dict) -> dict:
    """What the CPU plugin says it runs with: its defaults, and the IR compiled with `props` after the paged-attention
    transformation GenAI's pipelines apply on the CPU (the pipelines themselves do not expose their compiled model)."""
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation
    core = ov.Core()
    model = core.read_model(str(ir/'openvino_model.xml'))
    paged_attention_transformation(model)
    compiled = core.compile_model(model, 'CPU', props)
    text = lambda v: v.to_string() if hasattr(v, 'to_string') else str(v)
    keys = ('INFERENCE_PRECISION_HINT', 'KV_CACHE_PRECISION', 'INFERENCE_NUM_THREADS', 'EXECUTION_MODE_HINT')
    out = {}
    for k in keys:
        out[f'plugin_default_{k.lower()}'] = text(core.get_property('CPU', k))
        out[k.lower()] = text(compiled.get_property(k))
    return out

def config(max_tokens: int):
    "Greedy, exactly max_tokens new tokens."
    import openvino_genai as ov_genai
    c = ov_genai.GenerationConfig()
    c.max_new_tokens = max_tokens
    c.min_new_tokens = max_tokens
    c.ignore_eos = True
    c.do_sample = False
    c.apply_chat_template = False    # ids are passed, but a string prompt would get the chat template otherwise
    return c

def ids_tensor(prompt: list[int]):
    "One prompt as the [1, n] int64 `input_ids` both pipelines take."
    import numpy as np
    import openvino as ov
    return ov.Tensor(np.array([prompt], dtype=np.int64))

def batch1(ir: Path, prompts: list[list[int]], max_tokens: int, props: dict) -> dict:
    "LLMPipeline, the prompts one at a time after one warm-up call."
    import openvino_genai as ov_genai
    t0 = time.perf_counter()
    pipe = ov_genai.LLMPipeline(str(ir), 'CPU', **props)
    load = time.perf_counter() - t0
    pipe.generate(ids_tensor(prompts[0]), config(8))
    secs, tokens, rates = 0.0, [], []
    for p in prompts:
        t0 = time.perf_counter()
        res = pipe.generate(ids_tensor(p), config(max_tokens))
        dt = time.perf_counter() - t0
        out = list(res.tokens[0])
        secs += dt
        tokens.append(out)
        rates.append(len(out) / dt)
    n = sum(map(len, tokens))
    return {'prompts': len(prompts), 'output_tokens': n, 'seconds': secs, 'output_tok_s': n / secs,
            'per_prompt_tok_s': [round(r, 2) for r in rates], 'load_seconds': round(load, 2), 'token_ids': tokens}

def batched(ir: Path, prompts: list[list[int]], max_tokens: int, props: dict, cache_gb: int) -> dict:
    "ContinuousBatchingPipeline, all the prompts in one generate call after one warm-up call."
    import openvino_genai as ov_genai
    sched = ov_genai.SchedulerConfig()
    sched.cache_size = cache_gb
    sched.max_num_seqs = max(len(prompts), sched.max_num_seqs)
    sched.enable_prefix_caching = False    # nanoserve runs with its prefix cache off
    t0 = time.perf_counter()
    pipe = ov_genai.ContinuousBatchingPipeline(str(ir), sched, 'CPU', props)
    load = time.perf_counter() - t0
    ids = [ids_tensor(p) for p in prompts]
    pipe.generate(ids, [config(8)] * len(ids))
    t0 = time.perf_counter()
    res = pipe.generate(ids, [config(max_tokens)] * len(ids))
    secs = time.perf_counter() - t0
    tokens = [list(r.m_generation_ids[0]) for r in res]
    n = sum(map(len, tokens))
    return {'prompts': len(prompts), 'output_tokens': n, 'seconds': secs, 'output_tok_s': n / secs,
            'total_tok_s': (n + sum(map(len, prompts))) / secs, 'load_seconds': round(load, 2),
            'scheduler': {'cache_size_gb': sched.cache_size, 'max_num_seqs': sched.max_num_seqs,
                          'max_num_batched_tokens': sched.max_num_batched_tokens,
                          'dynamic_split_fuse': sched.dynamic_split_fuse, 'enable_prefix_caching': False},
            'token_ids': tokens}

def run(a) -> dict:
    import importlib.metadata as m
    import openvino, openvino_genai
    ir, prompts = Path(a.ir), json.loads(Path(a.prompts).read_text())
    if not all(isinstance(p, list) for p in prompts): sys.exit("PROMPTS_JSON must be a list of token-id lists")
    props = properties(a.threads, a.precision, a.kv_cache_precision)
    out = {'engine': f"openvino-genai {m.version('openvino-genai')}", 'openvino_genai': openvino_genai.__version__,
           'openvino': openvino.__version__, 'device': 'CPU', 'threads': a.threads, 'properties': props,
           'prompt_tokens': [len(p) for p in prompts], 'max_tokens': a.max_tokens}
    out.update(reported(ir, props))
    if a.batch1_prompts: out['batch1'] = batch1(ir, prompts[:a.batch1_prompts], a.max_tokens, props)
    if not a.skip_batch: out['batch'] = batched(ir, prompts, a.max_tokens, props, a.cache_gb)
    return out

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    e = sub.add_parser('export', help="optimum-cli's OpenVINO IR of MODEL_DIR in OUT_DIR")
    e.add_argument('model')
    e.add_argument('out')
    e.add_argument('--weight-format', default='fp16', help='fp32, fp16, int8, int4 (default fp16)')
    r = sub.add_parser('run', help='batch 1 (LLMPipeline) and all prompts at once (ContinuousBatchingPipeline)')
    r.add_argument('ir')
    r.add_argument('prompts', help='JSON: a list of prompts, each a list of token ids')
    r.add_argument('--max-tokens', type=int, default=128)
    r.add_argument('--batch1-prompts', type=int, default=4, help='prompts run one at a time (0: skip batch 1)')
    r.add_argument('--skip-batch', action='store_true', help='skip the all-at-once run')
    r.add_argument('--threads', type=int, default=2, help='INFERENCE_NUM_THREADS (default 2)')
    r.add_argument('--precision', default='bf16', help="INFERENCE_PRECISION_HINT: bf16 (default), f32, f16, or "
                   "'default' (the plugin's choice)")
    r.add_argument('--kv-cache-precision', default='default', help="KV_CACHE_PRECISION: 'default' (the plugin's "
                   "choice: u8 on these CPUs), bf16, f16, f32, u8")
    r.add_argument('--cache-gb', type=int, default=1, help="ContinuousBatchingPipeline's KV cache in GB (default 1)")
    a = p.parse_args()
    res = export(a.model, a.out, a.weight_format) if a.cmd == 'export' else run(a)
    print(json.dumps(res))
