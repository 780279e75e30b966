"""`nanoserve bench quality` as a user runs it, on the default model's real weights and a short stretch of the held-out
text: the CSV's rows, float32 held to itself, bfloat16 close to it (the refusals: nbs/66_quality.ipynb)."""
import csv, subprocess, sys
from pathlib import Path
from nanoserve.quality import HELD_OUT

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')

def bench(*args):
    return subprocess.run([NANOSERVE, 'bench', 'quality', *args], capture_output=True, text=True, timeout=600)

def test_the_default_model_in_bfloat16_against_float32(default_model, tmp_path):
    out = tmp_path/'quality.csv'
    r = bench('--model', str(default_model), '--modes', 'bfloat16', '--tokens', '600', '--window', '300',
              '--prompts', '3', '--max-tokens', '8', '--csv', str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    f32, bf16 = list(csv.DictReader(out.open()))
    assert (f32['mode'], bf16['mode']) == ('float32', 'bfloat16')
    assert f32['text'].startswith(HELD_OUT + ', Python ') and int(f32['tokens']) == 598          # two windows of 300, a token each unscored
    assert float(f32['kl_mean']) == 0 and f32['greedy_same'] == '3'       # the reference against itself
    # bfloat16's rounding moves the distribution a little, and the perplexity by far less than a percent
    assert 0 < float(bf16['kl_mean']) < 0.01, bf16
    assert abs(float(bf16['perplexity_vs_float32'])) < 0.01, bf16
    assert 'greedy = float32' in r.stdout and 'bfloat16' in r.stdout
