"The `nanoserve` command as scripts use it: `pull` prints the directory, `generate --json` prints one object per prompt."
import json, subprocess, sys
from pathlib import Path
import pytest
from nanoserve.generate import ReferenceLM, SampleSpec

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')

def run(*args, check=True):
    r = subprocess.run([NANOSERVE, *args], capture_output=True, text=True, timeout=300)
    if check: assert r.returncode == 0, r.stderr
    return r

def test_pull_prints_the_model_directory(default_model):
    r = run('pull')
    assert r.stdout.strip() == str(default_model)
    assert (Path(r.stdout.strip())/'model.safetensors').is_file()

def test_generate_json_chat_default_model(default_model):
    r = run('generate', '--chat', '--json', '--max-tokens', '48', 'What is the capital of France?')
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert len(rows) == 1 and 'Paris' in rows[0]['text'] and rows[0]['finish_reason'] == 'stop'
    lm = ReferenceLM(default_model)
    assert lm.tokenizer.decode(rows[0]['token_ids']) == rows[0]['text']

def test_generate_json_matches_library_for_each_prompt(tiny):
    path = tiny('llama_tied_gqa')
    r = run('generate', '--model', str(path), '--json', '--max-tokens', '6', '--temperature', '0.8', '--seed', '3', 'abc', 'xyz', 'abc')
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert [x['prompt'] for x in rows] == ['abc', 'xyz', 'abc']
    assert rows[0]['token_ids'] == rows[2]['token_ids']            # same seed, same prompt: same tokens
    lm = ReferenceLM(path)
    for x in rows:
        assert x['token_ids'] == lm.generate(x['prompt'], SampleSpec(max_tokens=6, temperature=0.8, seed=3)).token_ids

@pytest.mark.parametrize('args,message', [
    (['--top-p', '1.5'], 'top_p must be in (0, 1]'),
    (['--temperature', '-1'], 'temperature must be >= 0'),
    (['--dtype', 'int8'], "unknown dtype 'int8'"),
    (['--model', '/no/such/dir'], 'is neither a directory nor a model nanoserve can pull'),
])
def test_bad_flags_exit_2_with_a_message(args, message):
    r = run('generate', *args, 'hi', check=False)
    assert r.returncode == 2 and message in r.stderr and r.stdout == ''
