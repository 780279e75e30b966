#!/usr/bin/env python
"""Mixture-of-experts models, measured: batch-1 decode against the bandwidth ceiling of the active parameters' bytes, a
crowd, and the peak memory of a quantized load. Checkpoints: `bench/moe_checkpoint.py` (random weights of real shapes).

    python bench/moe.py decode /tmp/olmoe-shape --dtype bfloat16 --rounds 3
    python bench/moe.py decode /tmp/qwen3-30b-shape --quantization int4
    python bench/moe.py crowd /tmp/olmoe-shape --requests 32 --tokens 64
    python bench/moe.py rss /tmp/qwen3-30b-full --quantization int4      # /usr/bin/time -v around a load

`decode` builds the engine as `nanoserve generate` does, runs one greedy request (a 32-token prompt, `--tokens` new
tokens, ignore_eos) `--rounds` times and takes each round's median step; the ceiling is the machine's read bandwidth
(a float32 sum over 1 GiB, best of 5, measured before and after in the same process: the higher is used) over the
bytes a token reads: every layer's attention, norms and router, k of its experts (their packed copies as they are
held: bfloat16, or int8/int4 codes with their scales), the final norm and the LM head. `crowd` runs `--requests`
prompts together through `Engine.generate` and reports output tokens a second. `rss` loads the checkpoint (and plans
its KV pool) in a child process under `/usr/bin/time -v` and reports its maximum resident set beside the model's
weights and the pool. Each command appends its rows, with the machine, to bench/results/moe/<command>.csv."""
import argparse, csv, json, re, statistics, subprocess, sys, time
from pathlib import Path
import torch

RESULTS = Path(__file__).parent/'results'/'moe'


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of the tensors `module` holds and reads: its parameters, buffers and tensor attributes (the packed copies),
    each view counted once; a released weight's stride-0 stand-in and meta tensors count nothing."""
    seen, total = set(), 0
    for m in module.modules():
        attrs = [v for v in vars(m).values() if isinstance(v, torch.Tensor)]
        held = [*m._parameters.values(), *m._buffers.values(), *attrs]
        for t in held:
            if t is None or t.is_meta or (t.dim() > 0 and t.numel() > 1 and all(s == 0 for s in t.stride())): continue
            key = (t.data_ptr(), t.numel(), t.dtype)
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


def active_bytes(model) -> dict:
    "The bytes one decoded token reads, by part (the model as the engine holds it)."
    from nanoserve.experts import SparseMoE
    parts = dict(attention=0, norms=0, router=0, experts=0, dense_mlp=0)
    for layer in model.model.layers:
        parts['attention'] += tensor_bytes(layer.self_attn)
        parts['norms'] += tensor_bytes(layer.input_layernorm) + tensor_bytes(layer.post_attention_layernorm)
        mlp = layer.mlp.block if hasattr(layer.mlp, 'block') else layer.mlp
        if isinstance(mlp, SparseMoE):
            # the scores read the router's packed copy where the fast layers made one, else its weight
            parts['router'] += tensor_bytes(mlp.gate.product if mlp.gate.product is not None else mlp.gate)
            per_expert = statistics.mean(tensor_bytes(e) for e in mlp.experts)
            parts['experts'] += int(mlp.gate.top_k * per_expert)
        else: parts['dense_mlp'] += tensor_bytes(mlp)
    parts['norms'] += tensor_bytes(model.model.norm)
    parts['lm_head'] = tensor_bytes(model.lm_head)
    parts['embedding_row'] = model.config.hidden_size * model.dtype.itemsize
    parts['total'] = sum(parts.values())
    return parts


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    "Bytes a second a float32 sum over `gib` GiB reads, best of `repeats`."
    x = torch.ones(int(gib * 2**28), dtype=torch.float32)
    best = min(_timed(x.sum) for _ in range(repeats))
    return x.numel() * 4 / best


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def build(path: str, dtype: str, quantization: str, **config):
    from nanoserve.launch import build_engine
    from nanoserve.engine import EngineConfig
    from nanoserve.quant import quantize_model
    return build_engine(path, EngineConfig(dtype=dtype, quantization=quantization, **config), quantize=quantize_model)


def decode_steps(engine, tokens: int) -> list[float]:
    "Seconds of each decode step of one greedy request (its prefill and first token left out)."
    from nanoserve.sampling import SamplingParams
    engine.add_request(list(range(100, 132)), SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    stamps = []
    while engine.has_unfinished():
        engine.step()
        stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps[1:], stamps[2:])]


def write_rows(name: str, rows: list[dict], results: Path = RESULTS):
    "Append `rows` to `results`/`name`.csv (its header written with the first rows)."
    results.mkdir(parents=True, exist_ok=True)
    f = results/f'{name}.csv'
    new = not f.exists()
    with open(f, 'a', newline='') as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        if new: w.writeheader()
        w.writerows(rows)
    print(f'appended {len(rows)} row(s) to {f}')


def common(a) -> dict:
    from nanoserve.offline_bench import machine
    cfg = json.loads((Path(a.path)/'config.json').read_text())
    return dict(when=time.strftime('%Y-%m-%d %H:%M'), machine=machine(), command=' '.join(sys.argv),
                shape=cfg.get('_name_or_path', a.path), layers=cfg['num_hidden_layers'], dtype=a.dtype,
                quantization=a.quantization)


def cmd_decode(a):
    bw_before = read_bandwidth()
    t = time.perf_counter()
    engine = build(a.path, a.dtype, a.quantization, max_model_len=512)
    boot = time.perf_counter() - t
    grouped = sum(getattr(m, 'grouped', None) is not None for m in engine.model.modules())
    parts = active_bytes(engine.model)
    rounds = [statistics.median(decode_steps(engine, a.tokens)) for _ in range(a.rounds)]
    bw = max(bw_before, read_bandwidth())
    ceiling = bw / parts['total']
    rows = []
    for i, step in enumerate(rounds):
        rows.append(common(a) | dict(round=i, boot_s=round(boot, 1), grouped_layers=grouped,
                                     active_gb=round(parts['total'] / 1e9, 3), bandwidth_gb_s=round(bw / 1e9, 1),
                                     ceiling_tok_s=round(ceiling, 2), step_ms=round(step * 1e3, 1),
                                     tok_s=round(1 / step, 2), of_ceiling=round(1 / step / ceiling, 3)))
    print(json.dumps({k: round(v / 1e6, 1) for k, v in parts.items()}) + '  (MB a token)')
    for r in rows: print(f"round {r['round']}: {r['step_ms']} ms a step, {r['tok_s']} tok/s, "
                         f"{r['of_ceiling']:.1%} of the ceiling {r['ceiling_tok_s']} tok/s "
                         f"({r['active_gb']} GB a token at {r['bandwidth_gb_s']} GB/s)")
    write_rows('decode', rows)


def cmd_crowd(a):
    from nanoserve.sampling import SamplingParams
    engine = build(a.path, a.dtype, a.quantization, max_model_len=512, max_batch_size=a.requests)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (32,), generator=g).tolist() for _ in range(a.requests)]
    params = SamplingParams(max_tokens=a.tokens, temperature=0, ignore_eos=True)
    rows = []
    for i in range(a.rounds):
        t = time.perf_counter()
        outs = engine.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t
        n = sum(len(o.token_ids) for o in outs)
        rows.append(common(a) | dict(round=i, requests=a.requests, tokens=a.tokens, seconds=round(seconds, 2),
                                     output_tok_s=round(n / seconds, 2)))
        print(f"round {i}: {a.requests} requests x {a.tokens} tokens in {seconds:.1f} s: {n / seconds:.1f} tok/s")
    write_rows('crowd', rows)


def cmd_load(a):
    "(the child of `rss`) load as `nanoserve serve` does (glibc told as it tells it) and print what it holds."
    from nanoserve.weights import weight_bytes
    from nanoserve.engine import keep_freed_memory
    keep_freed_memory()
    engine = build(a.path, a.dtype, a.quantization, max_model_len=a.max_model_len)
    pool = engine.cache.k.numel() * engine.cache.k.element_size() * 2
    print(json.dumps(dict(weights=weight_bytes(engine.model), held=tensor_bytes(engine.model), kv_pool=pool)))


def cmd_rss(a):
    cmd = ['/usr/bin/time', '-v', sys.executable, __file__, 'load', a.path, '--dtype', a.dtype, '--quantization',
           a.quantization, '--max-model-len', str(a.max_model_len)]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if r.returncode: sys.exit(f"the load failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    held = json.loads([line for line in r.stdout.splitlines() if line.startswith('{')][-1])
    peak = int(re.search(r'Maximum resident set size \(kbytes\): (\d+)', r.stderr).group(1)) * 1024
    size = sum(f.stat().st_blocks * 512 for f in Path(a.path).glob('*.safetensors'))
    apparent = sum(f.stat().st_size for f in Path(a.path).glob('*.safetensors'))
    row = common(a) | dict(checkpoint_gb=round(apparent / 1e9, 2), on_disk_gb=round(size / 1e9, 2),
                           held_gb=round(held['held'] / 1e9, 2), kv_pool_gb=round(held['kv_pool'] / 1e9, 2),
                           peak_rss_gb=round(peak / 1e9, 2),
                           over_held_and_pool_gb=round((peak - held['held'] - held['kv_pool']) / 1e9, 2),
                           load_s=round(seconds, 1))
    print(json.dumps(row, indent=1))
    write_rows('rss', [row])


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('command', choices=['decode', 'crowd', 'rss', 'load'])
    p.add_argument('path')
    p.add_argument('--dtype', default='bfloat16')
    p.add_argument('--quantization', default='none')
    p.add_argument('--tokens', type=int, default=64)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--requests', type=int, default=32)
    p.add_argument('--max-model-len', type=int, default=4096)
    a = p.parse_args()
    {'decode': cmd_decode, 'crowd': cmd_crowd, 'rss': cmd_rss, 'load': cmd_load}[a.command](a)
