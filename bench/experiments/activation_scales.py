#!/usr/bin/env python
"""How W8A8 should scale its activations, measured before the kernel chose: the default model with its decoder layers'
products emulated in PyTorch (int8 weights, one scale an output, as `quantize_int8`; activations rounded to int8 and
back, then a float32 product), each variant's perplexity and mean KL against float32 over the first --tokens tokens of
the held-out text (`nanoserve.quality`'s scoring, windows of 1,024):

- one scale a row (a token's activations: the first kernel's arithmetic, OpenVINO's per-token quantization);
- one scale a group of 64 inputs (what the kernel does), and of 192 (the widest dividing every layer input);
- one scale a row after SmoothQuant's smoothing (each input channel divided by max|x|^a / max|w|^(1-a), a = 0.5, the
  weights' columns multiplied by it), the channels' max|x| calibrated on 4,096 tokens of the standard library's own
  docstrings (not the scored text).

    python bench/experiments/activation_scales.py --out bench/results/integer/activation_scales.txt
"""
import argparse, importlib, pydoc
from pathlib import Path
import torch
import nanoserve.quant as quant
from nanoserve.engine import EngineConfig
from nanoserve.launch import build_engine
from nanoserve.model import DenseKV
from nanoserve.offline_bench import machine
from nanoserve.pull import resolve_model
from nanoserve.quality import held_out_text, score

CALIBRATION = ['argparse', 'collections', 'json', 'logging', 'unittest', 'email', 'csv', 'datetime', 'pathlib',
               'subprocess', 'threading', 'itertools', 'functools', 're', 'os', 'typing', 'dataclasses', 'asyncio',
               'http.server', 'sqlite3']

class Emulated(torch.nn.Module):
    "A W8A8 layer in PyTorch whose activation scaling is set per variant (`setup`); records max|x| while calibrating."
    variant = {'group': None, 'calibrating': True}
    def __init__(self, weight, bias=None, wide=False):
        super().__init__()
        self.w, self.bias, self.amax, self.smooth, self.wq = weight.float(), bias, None, None, None
    def setup(self, alpha: float | None):
        self.smooth = torch.ones(self.w.shape[1]) if alpha is None else (
            self.amax.clamp(min=1e-5) ** alpha / self.w.abs().amax(0).clamp(min=1e-5) ** (1 - alpha))
        q, s = quant.quantize_int8(self.w * self.smooth)
        self.wq = q.float() * s[:, None]
    def forward(self, x):
        xf = x.float()
        if self.variant['calibrating']:
            a = xf.abs().amax(0)
            self.amax = a if self.amax is None else torch.maximum(self.amax, a)
            y = xf @ self.w.T
        else:
            xs = xf / self.smooth
            v = xs.view(xs.shape[0], -1, self.variant['group'] or xs.shape[1])
            amax = v.abs().amax(-1, keepdim=True).clamp(min=1e-30)
            y = (torch.round(v * (127 / amax)) * (amax / 127)).view_as(xs) @ self.wq.T
        if self.bias is not None: y = y + self.bias.float()
        return y.to(x.dtype)

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default='bench/results/integer/activation_scales.txt')
    p.add_argument('--tokens', type=int, default=16384)
    args = p.parse_args()
    quant.W8A8Linear = Emulated                                  # quantize_model builds these instead
    path = resolve_model(None)
    ref = build_engine(path, EngineConfig(dtype='float32', max_model_len=1024))
    emu = build_engine(path, EngineConfig(quantization='w8a8', max_model_len=1024, decode_call=False))
    layers = [m for m in emu.model.modules() if isinstance(m, Emulated)]
    text = '\n\n'.join(pydoc.getdoc(importlib.import_module(m)) for m in CALIBRATION)
    cal = ref.tokenizer.encode(text, add_special_tokens=False)[:4096]
    with torch.inference_mode():
        for s in range(0, len(cal), 512):
            x = torch.tensor(cal[s:s + 512])
            emu.model(x, torch.arange(len(x)), DenseKV(len(emu.model.model.layers)).step([len(x)]))
    Emulated.variant['calibrating'] = False
    ids = ref.tokenizer.encode(held_out_text(), add_special_tokens=False)[:args.tokens]
    lines = [f"machine: {machine()}", f"command: python bench/experiments/activation_scales.py --out {args.out} "
             f"--tokens {args.tokens}", f"the default model, W8A8 emulated in PyTorch, {len(ids):,} tokens of the held-out "
             "text against float32", f"{'activations':<52}{'perplexity':>12}{'mean KL':>10}"]
    for label, group, alpha in (('one scale a row', None, None), ('one scale a group of 64 (the kernel)', 64, None),
                                ('one scale a group of 192', 192, None),
                                ('one scale a row, SmoothQuant-smoothed (a = 0.5)', None, 0.5)):
        Emulated.variant['group'] = group
        for m in layers: m.setup(alpha)
        s = score({'float32': ref, 'w8a8': emu}, 'float32', ids, 1024)
        lines.append(f"{label:<52}{s['w8a8'].perplexity / s['float32'].perplexity - 1:>+12.2%}{s['w8a8'].kl_mean:>10.4f}")
        print(lines[-1], flush=True)
    Path(args.out).write_text('\n'.join(lines) + '\n')

if __name__ == '__main__': main()
