"""`nanoserve bench prefill` as a user runs it: a real engine (a tiny checkpoint), both modes on the same prompts, the
CSV's rows and the peak table; refusals before anything runs."""
import csv, subprocess, sys
from pathlib import Path
from nanoserve.prefill_bench import peak_kinds

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')

def bench(*args):
    return subprocess.run([NANOSERVE, 'bench', 'prefill', *args], capture_output=True, text=True, timeout=600)

def test_both_modes_every_length_and_batch(tiny, tmp_path):
    out = tmp_path/'prefill.csv'
    r = bench('--model', str(tiny('llama_tied_gqa')), '--dtype', 'float32', '--lengths', '64,200', '--crowd', '3',
              '--rounds', '2', '--compare-modes', '--csv', str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    engines = {'nanoserve', 'nanoserve --no-batch-invariant'}
    want = {(e, L, b, k) for e in engines for L in ('64', '200') for b in ('1', '3') for k in ('0', '1')}
    assert {(r['engine'], r['prompt_len'], r['batch'], r['round']) for r in rows} == want and len(rows) == len(want)
    for row in rows:
        assert float(row['seconds']) > 0 and int(row['steps']) >= 1
        assert 0 < float(row['attention_share_of_time']) < 1
        tokens = int(row['prompt_len']) * int(row['batch'])
        assert abs(float(row['prompt_tok_s']) * float(row['seconds']) - tokens) < 1e-6
        assert row['command'].startswith('nanoserve bench prefill --model') and 'threads' in row['machine']
        assert row['model'] == tiny('llama_tied_gqa').name
        best = next((k for k in ('avx512_fma', 'avx2_fma') if k in peak_kinds()), '')
        assert row['peak_kind'] == best                               # float32's product peak
    # the peak table names every kind this CPU has, then the memory's rate; the summary a row per length, batch, engine
    assert all(any(line.startswith(k) for line in r.stdout.splitlines()) for k in peak_kinds())
    assert 'memory read:' in r.stdout
    cases = (['64', '1'], ['64', '3'], ['200', '1'], ['200', '3'])
    assert sum(line.split()[:2] in cases for line in r.stdout.splitlines()) == 8

def test_refusals_before_anything_loads(tiny, tmp_path):
    out = tmp_path/'never.csv'
    model = str(tiny('llama_tied_gqa'))
    r = bench('--model', model, '--lengths', '200', '--max-model-len', '128', '--csv', str(out))
    assert r.returncode != 0 and "a 200-token prompt and the engine's max_model_len is 128" in r.stderr, r.stderr
    r = bench('--model', model, '--lengths', '64,abc', '--csv', str(out))
    assert r.returncode != 0 and "--lengths must be comma-separated token counts, got '64,abc'" in r.stderr
    r = bench('--model', model, '--compare-vllm', '--vllm-venv', str(tmp_path/'none'), '--csv', str(out))
    assert r.returncode != 0 and '--compare-vllm: no vLLM Python at' in r.stderr
    assert not out.exists()
