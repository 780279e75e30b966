#!/usr/bin/env python
"""LoRA adapters, measured: a crowd spread over adapters against the base model on the same plan, batch 1 with one
adapter against the base, the cost of loading an adapter while requests run, and the delta kernel beside the two
PyTorch ways of batching many adapters (grouped by adapter, gathered per row).

    python bench/lora.py crowd ~/.cache/nanoserve/models/SmolLM2-135M-Instruct --rounds 3
    python bench/lora.py crowd /tmp/smollm2-1.7b-shape --rounds 3 --tokens 32
    python bench/lora.py kernel ~/.cache/nanoserve/models/SmolLM2-135M-Instruct

`crowd` builds two engines as `nanoserve serve` builds them (default flags, `--dtype`): one with `--enable-lora
--max-loras 4` holding `--adapters` random adapters of rank `--rank` on all seven projections (`random_adapter`:
PEFT's files), one without adapters. Each round runs, in alternating order, `--requests` random 32-token prompts
(`--tokens` new tokens each, ignore_eos, greedy) through `Engine.generate`: under the adapters round-robin, as the
base model in the LoRA engine, and in the plain engine; then batch 1 (one request's median decode step) the same three
ways. Output tokens a second and their ratios over the plain engine go to bench/results/lora/crowd.csv. Between two
crowd steps it also loads one more adapter (read and laid out beforehand, as the server reads it off the engine's
thread) and times that install against the median step: how long a load stalls the running requests.

`kernel` times one product's delta, 32 rows over 4 adapters of rank 16, three ways: `lora_add` (C, rows grouped by
adapter, fixed order per row), PyTorch grouped by adapter (`ProductLora.reference`), and PyTorch gathered per row (each
row's A and B fetched into [rows, r, in] and [rows, out, r] and two batched products); the product shapes of the
model at `path`. Rows go to bench/results/lora/kernel.csv."""
import argparse, json, statistics, sys, tempfile, time
from pathlib import Path
import torch
from moe import write_rows      # bench/moe.py: rows appended to a CSV

RESULTS = Path(__file__).parent/'results'/'lora'
TARGETS = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj')


def common(a) -> dict:
    from nanoserve.offline_bench import machine
    cfg = json.loads((Path(a.path)/'config.json').read_text())
    shape = f"{cfg['num_hidden_layers']} layers x {cfg['hidden_size']} (intermediate {cfg['intermediate_size']})"
    return dict(when=time.strftime('%Y-%m-%d %H:%M'), machine=machine(), command=' '.join(sys.argv),
                model=Path(a.path).name, shape=shape, dtype=a.dtype, torch=torch.__version__)


def adapters(path: str, n: int, rank: int, tmp: Path) -> list[Path]:
    from nanoserve.config import ModelConfig
    from nanoserve.lora_batch import random_adapter
    cfg = ModelConfig.from_dir(path)
    return [random_adapter(tmp/f'a{i}', cfg, TARGETS, rank=rank, alpha=2 * rank, seed=i, std=0.01,
                           dtype=torch.bfloat16) for i in range(n)]


def crowd_rate(engine, prompts, params, lora) -> float:
    t = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False, lora=lora)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)


def batch1_step(engine, prompt, tokens: int, lora) -> float:
    "The median decode step (seconds) of one greedy request alone."
    from nanoserve.sampling import SamplingParams
    engine.add_request(prompt, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True), lora=lora)
    stamps = []
    while engine.has_unfinished():
        engine.step()
        stamps.append(time.perf_counter())
    return statistics.median(b - a for a, b in zip(stamps[1:], stamps[2:]))


def load_stall(engine, prompts, params, extra: Path) -> tuple[float, float]:
    "(seconds of installing a read adapter between two steps, the crowd's median step) with the crowd running."
    for p in prompts: engine.add_request(p, params)
    stamps, install = [], None
    read = engine.lora.read('late', extra)                 # off the engine's thread in a server
    while engine.has_unfinished():
        if len(stamps) == 10:
            t = time.perf_counter()
            engine.load_adapter('late', read=read)
            install = time.perf_counter() - t
        engine.step()
        stamps.append(time.perf_counter())
    engine.unload_adapter('late')
    return install, statistics.median(b - a for a, b in zip(stamps[1:], stamps[2:]))


def cmd_crowd(a):
    from nanoserve.launch import build_engine
    from nanoserve.sampling import SamplingParams
    tmp = Path(tempfile.mkdtemp(prefix='lora-bench-'))
    paths = adapters(a.path, a.adapters + 1, a.rank, tmp)
    kw = dict(dtype=a.dtype, max_model_len=512, max_batch_size=max(32, a.requests))
    lora = build_engine(a.path, enable_lora=True, max_loras=a.adapters + 1, max_lora_rank=a.rank, **kw)
    names = [f'a{i}' for i in range(a.adapters)]
    for n, p in zip(names, paths): lora.load_adapter(n, p)
    plain = build_engine(a.path, **kw)
    assert lora.runner.decode_call is not None and plain.runner.decode_call is not None, lora.runner.decode_call_off
    g = torch.Generator().manual_seed(0)
    vocab = lora.model.config.vocab_size
    prompts = [torch.randint(100, vocab - 1, (32,), generator=g).tolist() for _ in range(a.requests)]
    params = SamplingParams(max_tokens=a.tokens, temperature=0, ignore_eos=True)
    spread = [names[i % len(names)] for i in range(a.requests)]
    arms = {'adapters': (lora, spread), 'base_in_lora_engine': (lora, None), 'plain': (plain, None)}
    crowd_rate(plain, prompts[:4], params, None)           # first calls (kernels built, pages touched) left out
    crowd_rate(lora, prompts[:4], params, spread[:4])
    rows = []
    for r in range(a.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        crowd = {k: crowd_rate(arms[k][0], prompts, params, arms[k][1]) for k in order}
        one = {k: batch1_step(arms[k][0], prompts[0], a.tokens, None if arms[k][1] is None else names[0])
               for k in order}
        install, step = load_stall(lora, prompts, params, paths[-1])
        row = common(a) | dict(round=r, requests=a.requests, tokens=a.tokens, adapters=a.adapters, rank=a.rank,
                               order=' '.join(order))
        for k in arms: row[f'crowd_{k}_tok_s'] = round(crowd[k], 1)
        for k in arms: row[f'batch1_{k}_tok_s'] = round(1 / one[k], 2)
        row |= dict(crowd_ratio=round(crowd['adapters'] / crowd['plain'], 3),
                    crowd_ratio_same_engine=round(crowd['adapters'] / crowd['base_in_lora_engine'], 3),
                    batch1_ratio=round(one['plain'] / one['adapters'], 3),
                    load_install_ms=round(install * 1e3, 2), crowd_step_ms=round(step * 1e3, 1),
                    load_in_steps=round(install / step, 3))
        rows.append(row)
        print(f"round {r}: crowd {crowd['adapters']:.0f} tok/s under {a.adapters} adapters, {crowd['plain']:.0f} "
              f"plain ({row['crowd_ratio']}x; {row['crowd_ratio_same_engine']}x the LoRA engine's base); batch 1 "
              f"{row['batch1_adapters_tok_s']} vs {row['batch1_plain_tok_s']} tok/s ({row['batch1_ratio']}x); "
              f"a load installs in {row['load_install_ms']} ms, {row['load_in_steps']} of a {step * 1e3:.1f} ms step")
    write_rows('crowd', rows, RESULTS)


def gathered(x, y, rows, a_stack, bt_stack, scales):
    "Each row's A and B gathered by its slot, two batched products: every adapter read once per row."
    live = rows >= 0
    idx = rows.clamp(min=0)
    h = torch.bmm(a_stack[idx], x.unsqueeze(-1)).squeeze(-1)           # [n, r]
    d = torch.bmm(h.unsqueeze(1), bt_stack[idx]).squeeze(1)             # [n, out]
    y += (d * scales[idx, None] * live[:, None]).to(y.dtype)


def cmd_kernel(a):
    from nanoserve.config import ModelConfig
    from nanoserve.lora_batch import ProductLora, LoraProductC, lora_kernel
    from nanoserve.lora import projection_shape
    import ctypes
    cfg, lib, dt = ModelConfig.from_dir(a.path), lora_kernel(), getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    rows_ = torch.tensor([i % a.adapters for i in range(a.rows)], dtype=torch.int64)
    out = []
    for target, fused in (('q_proj', ('q_proj', 'k_proj', 'v_proj')), ('o_proj', ('o_proj',)),
                          ('gate_proj', ('gate_proj', 'up_proj')), ('down_proj', ('down_proj',))):
        k = projection_shape(cfg, target)[1]
        targets = tuple((t, projection_shape(cfg, t)[0]) for t in fused)
        p = ProductLora(0, torch.nn.Identity(), targets, k, a.adapters)
        weights = [{(0, t): (torch.randn(a.rank, k, generator=g) * 0.02, torch.randn(w, a.rank, generator=g) * 0.02)
                    for t, w in targets} for _ in range(a.adapters)]
        for s in range(a.adapters): p.put(s, p.prepare(weights[s], dt))
        scales = torch.full((a.adapters,), 2.0)
        c = LoraProductC(k, p.out_features, len(targets), a.adapters, p.table.shape[1], p.segs.data_ptr(),
                         p.table.data_ptr(), scales.data_ptr())
        x = torch.randn(a.rows, k, generator=g).to(dt)
        y = torch.zeros(a.rows, p.out_features, dtype=dt)
        # gathered: the segments' A stacked, B^T placed block-diagonally so one product writes every output
        ra = a.rank * len(targets)
        a_stack = torch.stack([torch.cat([w[(0, t)][0] for t, _ in targets]) for w in weights]).to(dt)
        bt_stack = torch.zeros(a.adapters, ra, p.out_features, dtype=dt)
        for s, w in enumerate(weights):
            col = 0
            for j, (t, width) in enumerate(targets):
                bt_stack[s, j * a.rank:(j + 1) * a.rank, col:col + width] = w[(0, t)][1].t().to(dt)
                col += width
        ways = {'lora_add': lambda: lib.lora_add(ctypes.byref(c), x.data_ptr(), y.data_ptr(), a.rows,
                                                 rows_.data_ptr(), x.element_size(), torch.get_num_threads()),
                'grouped_torch': lambda: p.reference(x, y, rows_, scales.tolist()),
                'gathered_torch': lambda: gathered(x, y, rows_, a_stack, bt_stack, scales)}
        for name, f in ways.items():
            for _ in range(3): f()
            times = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                f()
                times.append(time.perf_counter() - t)
            us = statistics.median(times) * 1e6
            out.append(common(a) | dict(product='/'.join(fused), k=k, n=p.out_features, rows=a.rows,
                                        adapters=a.adapters, rank=a.rank, way=name, median_us=round(us, 1),
                                        min_us=round(min(times) * 1e6, 1), max_us=round(max(times) * 1e6, 1)))
            print(f"{'/'.join(fused):28s} {name:15s} {us:9.1f} us (min {min(times) * 1e6:.1f})")
    write_rows('kernel', out, RESULTS)


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('command', choices=['crowd', 'kernel'])
    p.add_argument('path')
    p.add_argument('--dtype', default='bfloat16')
    p.add_argument('--adapters', type=int, default=4)
    p.add_argument('--rank', type=int, default=16)
    p.add_argument('--requests', type=int, default=32)
    p.add_argument('--rows', type=int, default=32)
    p.add_argument('--tokens', type=int, default=64)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--repeats', type=int, default=50)
    a = p.parse_args()
    {'crowd': cmd_crowd, 'kernel': cmd_kernel}[a.command](a)
