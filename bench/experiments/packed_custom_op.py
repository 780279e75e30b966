#!/usr/bin/env python
"""Experiment (not adopted): the compiled decode step (`--cuda-graphs` on CPU, Day 54's compile recorder) with oneDNN's packed
weights. Inductor cannot trace a packed (mkldnn) tensor, so Day 06 hands the traced step the plain weight; here the packed
product is a custom operator that Inductor calls as it is, finding the packed weight beside the plain one. Prints
profile_step.py's breakdown for the eager step and the compiled one:

    OMP_NUM_THREADS=1 taskset -c 1 python bench/experiments/packed_custom_op.py --rows 32

One run in the speed issue's third pass (AMD EPYC, avx512_bf16, one thread, bfloat16, 32 rows, 128-token contexts): eager
116 ms (GEMMs 54, attention 30, gather 12); compiled 167 ms with GEMMs at 59 ms (packed again), but attention 69 ms,
because the recorded step attends over its width bucket (256 keys for 129-160-token contexts) and gathers the window then
concatenates the step's own K/V onto it.
"""
import argparse, sys
from pathlib import Path
import torch, torch.nn.functional as F
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_step import measure, resolve_model
from nanoserve import fast
from nanoserve.fast import FastLinear

@torch.library.custom_op('nanoserve_experiment::packed_linear', mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    p = getattr(weight, 'packed', None)
    if p is None: return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), p, bias, 'none', [], '')

@packed_linear.register_fake
def _(x, weight, bias): return x.new_empty(x.shape[0], weight.shape[0])

plain_pack, plain_forward = FastLinear.pack, FastLinear.forward
def pack(self, batch_size=32):
    ok = plain_pack(self, batch_size)
    if ok: self.weight.packed = self.packed
    return ok
def forward(self, x):
    if torch.compiler.is_compiling() and getattr(self.weight, 'packed', None) is not None: return packed_linear(x, self.weight, self.bias)
    return plain_forward(self, x)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(); ap.add_argument('--rows', type=int, default=32); ap.add_argument('--dtype', default='bfloat16'); args = ap.parse_args()
    FastLinear.pack, FastLinear.forward = pack, forward
    path = resolve_model('SmolLM2-135M-Instruct', print)
    for arm in ('fast', 'fast+compile'):
        r = measure(path, args.dtype, args.rows, arm)
        print(f"{arm:<13} step {r['step_ms_p50']:6.1f} ms  " + ', '.join(f"{k[:-3]} {v:.1f}" for k, v in r.items() if k.endswith('_ms') and k != 'step_ms_p50'), flush=True)
