"""The GPU machine's one call, checked where it is prepared: the wheels it needs are derived from the installed closure
(bench/gpu/wheels.py), prepare.sh's list is that one, run.sh refuses without a GPU before it installs anything, and the
random-weight checkpoint loads and has the margins it is scaled for (bench/gpu/checkpoint.py)."""
import os, subprocess, sys
from importlib import metadata
from pathlib import Path
import pytest, torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / 'bench' / 'gpu'
sys.path.insert(0, str(GPU))
import wheels, checkpoint

@pytest.fixture(scope='module')
def carried() -> dict[str, str]:
    out = subprocess.run([sys.executable, str(GPU / 'wheels.py')], capture_output=True, text=True, check=True).stdout
    return dict(line.split('==') for line in out.split())

def test_what_the_first_run_lacked_is_carried(carried):
    "What the first run lacked (every command died at import) travels, at this .venv's versions; torch and kin do not."
    for name in ('fastapi', 'opentelemetry-api', 'llguidance', 'openai', 'uvicorn', 'pydantic-core', 'gguf',
                 'fastcore'):
        assert carried[name] == metadata.version(name), name
    assert not {'torch', 'numpy', 'tokenizers', 'safetensors', 'triton'} & set(carried)

def test_the_carried_closure_is_complete(carried):
    "Every requirement of a carried package (its marker true on the machine) is carried too, or the machine has it."
    there = wheels.machine_packages()
    for name in carried:
        for r in metadata.distribution(name).requires or []:
            req = Requirement(r)
            if req.marker is not None and not req.marker.evaluate(wheels.MACHINE): continue
            dep = canonicalize_name(req.name)
            assert dep in carried or dep in there, f"{name} needs {dep}, which neither travels nor is there"

def test_prepare_dry_run_lists_the_derivation_and_writes_nothing(carried, tmp_path):
    before = sorted(p.name for p in (ROOT / '.whl').glob('*')) if (ROOT / '.whl').exists() else None
    out = subprocess.run(['bash', str(GPU / 'prepare.sh'), '--dry-run'], capture_output=True, text=True,
                         check=True).stdout
    assert {l.split('  #')[0] for l in out.splitlines()} == {f'{n}=={v}' for n, v in carried.items()}
    after = sorted(p.name for p in (ROOT / '.whl').glob('*')) if (ROOT / '.whl').exists() else None
    assert before == after

@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is here: run.sh would run')
def test_run_refuses_without_a_gpu(tmp_path):
    env = {**os.environ, 'OUT': str(tmp_path / 'out'), 'PATH': os.environ['PATH']}
    (tmp_path / 'out').mkdir()
    r = subprocess.run(['bash', str(GPU / 'run.sh')], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and 'no NVIDIA GPU here' in r.stderr
    assert list((tmp_path / 'out').iterdir()) == []

def test_random_checkpoint_loads_with_margins_scaled(tiny, tmp_path):
    """The same seed with the final norm scaled by 16: nanoserve loads both (and greedy-decodes the wide one),
    transformers ranks the tokens the same, every logit 16 times as far apart."""
    import transformers
    from nanoserve.model import load_model
    from nanoserve.engine import Engine
    from nanoserve.sampling import SamplingParams
    plain = checkpoint.build(tiny('llama_tied_gqa'), tmp_path / 'plain', dtype='float32')
    wide = checkpoint.build(tiny('llama_tied_gqa'), tmp_path / 'wide', dtype='float32', scale=16)
    assert (wide / 'tokenizer.json').exists() and (wide / 'model.safetensors').exists()
    assert torch.allclose(load_model(wide).model.norm.weight, 16 * load_model(plain).model.norm.weight)
    engine = Engine.build(str(wide), dtype='float32', max_batch_size=1)
    out = engine.generate(['hello world'], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)[0]
    assert len(out.token_ids) == 4
    ids = torch.tensor([[3, 17, 42, 99, 5]])
    with torch.no_grad():
        lp, lw = (transformers.AutoModelForCausalLM.from_pretrained(p)(ids).logits[0, -1] for p in (plain, wide))
    assert torch.equal(lp.argsort(descending=True)[:5], lw.argsort(descending=True)[:5])
    assert torch.allclose(lw, 16 * lp, rtol=1e-3, atol=1e-3)

def test_run_dry_run_walks_every_step_in_seconds(tmp_path):
    """`run.sh --dry-run` on the CPU: every step's command printed, both checkpoints' shapes built on the meta device
    (Qwen3-0.6B's: 596M parameters) and nano-vllm's plan drawn (its 256 sequences, 133,966 output tokens)."""
    env = {**os.environ, 'OUT': str(tmp_path), 'PYTHON': sys.executable}
    r = subprocess.run(['bash', str(GPU / 'run.sh'), '--dry-run'], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'qwen3, 28 layers, hidden 1024, 16/8 heads, vocab 151936: 596M parameters' in r.stdout
    assert '"sequences": 256' in r.stdout and '"output_tokens": 133966' in r.stdout
    for name in ('checkpoint', 'checkpoint-qwen3', 'cuda-tests', 'nanovllm-qwen3', 'batch1-default', 'graph'):
        assert f'=== {name} (at most' in r.stdout, name
    assert '--rates 1,2,4,8,16' in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ['log.txt']

def test_nanovllm_workload_runs_and_writes_its_numbers(tiny, tmp_path):
    "The workload script end to end on a tiny model: its two rows (throughput, batch 1) in the CSV."
    import csv
    out = tmp_path / 'nv.csv'
    r = subprocess.run([sys.executable, str(GPU / 'nanovllm.py'), str(tiny('llama_tied_gqa')), '--num-seqs', '3',
                        '--min-len', '5', '--max-len', '9', '--batch1-tokens', '3', '--csv', str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    assert [row['measure'] for row in rows] == ['nano-vllm workload', 'batch 1']
    assert all(float(row['value']) > 0 for row in rows)
