#!/usr/bin/env python
"""The `nanoserve` command with Day 06's bfloat16 product kernel as the speed issue's thirteenth pass left it
(bench/experiments/bf16_dot_thirteenth_pass.c) in place of today's, for A/B runs of the whole engine (bench/kernel_ab.sh).
Everything else is this checkout's. Not part of CI.

    python bench/nanoserve_13th.py bench offline --dtypes bfloat16 --repeats 1
"""
import sys
from pathlib import Path
from nanoserve import fast
fast.AMX_LINEAR_C = (Path(__file__).resolve().parent/'experiments'/'bf16_dot_thirteenth_pass.c').read_text()   # before anything builds it
from nanoserve.cli import main

if __name__ == '__main__':
    assert 'PASS_ROWS' not in fast.AMX_LINEAR_C
    sys.exit(main())
