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
    r = run('generate', '--chat', '--json', '--max-tokens', '48',
            'What is the capital of France? Answer in one sentence.')
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
    (['--model', '/no/such/dir'], 'is neither a directory, a model nanoserve can pull'),
])
def test_bad_flags_exit_2_with_a_message(args, message):
    r = run('generate', *args, 'hi', check=False)
    assert r.returncode == 2 and message in r.stderr and r.stdout == ''

def test_prompts_file_runs_as_one_batch_in_input_order(tiny, tmp_path):
    from nanoserve.engine import Engine
    from nanoserve.sampling import SamplingParams
    path = tiny('llama_tied_gqa')
    lines = [{'prompt': 'hello world', 'max_tokens': 5},
             {'prompt': 'abc', 'seed': 11, 'temperature': 0.9, 'max_tokens': 7},
             {'prompt': 'the capital', 'max_tokens': 3, 'ignore_eos': True}]
    f = tmp_path/'p.jsonl'
    f.write_text('\n'.join(json.dumps(l) for l in lines) + '\n')
    r = run('generate', '--model', str(path), '--json', '--prompts-file', str(f), '--max-batch-size', '2', '--num-kv-blocks', '64')
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert [x['prompt'] for x in rows] == [l['prompt'] for l in lines]
    engine = Engine.build(path, dtype='float32')
    want = engine.generate([l['prompt'] for l in lines], [SamplingParams(**{'temperature': 0.0, **{k: v for k, v in l.items() if k != 'prompt'}}) for l in lines], use_tqdm=False)
    assert [x['token_ids'] for x in rows] == [o.token_ids for o in want]

def test_prompts_file_errors_name_the_line(tiny, tmp_path):
    f = tmp_path/'p.jsonl'
    f.write_text('{"prompt": "ok"}\n{"prompt": "x", "top_p": 2}\n')
    r = run('generate', '--model', str(tiny('llama_tied_gqa')), '--prompts-file', str(f), check=False)
    assert r.returncode == 2 and 'top_p must be in (0, 1], got 2' in r.stderr
    f.write_text('{"prompt": "ok"}\nnot json\n')
    r = run('generate', '--model', str(tiny('llama_tied_gqa')), '--prompts-file', str(f), check=False)
    assert r.returncode == 2 and 'p.jsonl:2: not valid JSON' in r.stderr

def test_bench_offline_writes_csv(tiny, tmp_path):
    import csv
    out = tmp_path/'b.csv'
    r = run('bench', 'offline', '--model', str(tiny('llama_tied_gqa')), '--num-requests', '4', '--prompt-len', '4:20',
            '--output-len', '4', '--batch1-requests', '1', '--compare-transformers', '--hf-batch-size', '2',
            '--dtypes', 'float32', '--max-batch-size', '4', '--csv', str(out))
    rows = list(csv.DictReader(open(out)))
    assert [(x['engine'], x['batch']) for x in rows] == [('nanoserve', '4'), ('nanoserve', '1'), ('transformers.generate', '2')]
    assert all(float(x['output_tok_s']) > 0 for x in rows) and 'nanoserve / transformers' in r.stdout

def test_bench_offline_repeats_every_engine_in_turn(tiny, tmp_path):
    "`--repeats 2`: each engine twice, in rounds (a round is every engine once), and the table names the fastest and the median."
    import csv
    out = tmp_path/'b.csv'
    r = run('bench', 'offline', '--model', str(tiny('llama_tied_gqa')), '--num-requests', '2', '--prompt-len', '4:8', '--output-len', '3',
            '--batch1-requests', '1', '--compare-transformers', '--hf-batch-size', '2', '--dtypes', 'float32', '--max-batch-size', '2',
            '--repeats', '2', '--csv', str(out))
    rows = list(csv.DictReader(open(out)))
    assert [(x['engine'], x['repeat']) for x in rows] == [(e, rep) for rep in '01' for e in ('nanoserve', 'nanoserve', 'transformers.generate')]
    assert 'fastest and median of 2 rounds' in r.stdout and '(medians: ' in r.stdout
    assert run('bench', 'offline', '--model', str(tiny('llama_tied_gqa')), '--repeats', '0', check=False).returncode == 2

def test_runner_pooling_is_for_serve(tiny):
    "--runner pooling embeds: the commands that write text refuse it, naming what to run instead, before anything loads."
    for cmd in (['generate', 'hello'], ['bench', 'offline']):
        r = run(*cmd, '--model', str(tiny('llama_tied_gqa')), '--runner', 'pooling', check=False)
        assert r.returncode == 2 and 'nanoserve serve --runner pooling' in r.stderr and '/v1/embeddings' in r.stderr, r.stderr
    r = run('serve', '--model', str(tiny('llama_tied_gqa')), '--runner', 'pooling', '--cuda-graphs', check=False)
    assert r.returncode == 2 and 'no decode steps' in r.stderr, r.stderr
