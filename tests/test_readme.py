"""Every shell and Python example of the README, extracted from README.md and run as it is written against a server that the
README's own `make serve` block starts: the answers must name Paris, streamed and not. Only the base URL is substituted: the
README says http://127.0.0.1:8000 (what `make serve` serves on), and the test cannot rely on port 8000 being free on a shared
machine (parallel test workers, another server), so it starts `make serve` with PORT=0, reads the port the server announces,
and puts that URL where the README has its own."""
import json, os, re, subprocess, sys
from pathlib import Path
import pytest
from nanoserve.loadgen import spawn_server

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT/'README.md').read_text()
BASE = 'http://127.0.0.1:8000'
FENCE = re.compile(r'^```(\w*)\n(.*?)^```$', re.M | re.S)
BLOCKS = [(lang or 'python', code) for lang, code in FENCE.findall(README)]   # an unlabelled block is a notebook code cell: Python
SHELL = [code for lang, code in BLOCKS if lang in ('bash', 'sh')]
SERVER = [code for code in SHELL if 'make serve' in code]
# the two-machine commands of the deployment section: tests/test_hosts.py runs them on two test hosts
TWO_HOSTS = [code for code in SHELL if code.startswith('# two machines:')]
CLIENTS = [code for code in SHELL if 'make serve' not in code and code not in TWO_HOSTS]
PYTHON = [code for lang, code in BLOCKS if lang == 'python']
QUESTION = 'What is the capital of France? Answer in one sentence.'

def test_the_readme_has_only_runnable_examples():
    assert {lang for lang, _ in BLOCKS} <= {'bash', 'python'}, 'a fenced block the test would not run: make it bash or python'
    assert len(SERVER) == 1 and SERVER[0].strip() == 'make serve', 'one block starts the server, and it is `make serve`'
    for code in CLIENTS + PYTHON:
        for addr in re.findall(r'https?://[\w.]+:\d+', code): assert addr == BASE, f'an example talks to {addr}, not {BASE}'
    assert sum(BASE in code for code in CLIENTS) >= 2 and sum(BASE in code for code in PYTHON) >= 2   # curl, chat; openai twice
    assert len(TWO_HOSTS) == 1 and TWO_HOSTS[0].count('torchrun ') == 2, 'one block of two-machine commands'
    import test_hosts                                       # the block test_hosts runs on two test hosts is this one
    commands = re.findall(r'^torchrun .*?(?<!\\)$', TWO_HOSTS[0], re.M | re.S)
    assert test_hosts.readme_two_host_commands() == [' '.join(c.replace('\\\n', ' ').split()) for c in commands]

@pytest.fixture(scope='module')
def server(default_model):
    "The README's `make serve`, run as written (PORT=0 and this interpreter's venv passed to make through MAKEFLAGS)."
    env = {'MAKEFLAGS': f'PORT=0 BIN={Path(sys.executable).parent}'}
    with spawn_server(command=['bash', '-c', SERVER[0]], port=0, cwd=str(ROOT), env=env, timeout=600) as (url, _):
        yield url

def run(cmd: list[str], url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, 'PATH': f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{cmd[:2]} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r

@pytest.mark.parametrize('i', range(len(CLIENTS)))
def test_each_shell_example(server, i):
    code = CLIENTS[i].replace(BASE, server)
    out = run(['bash', '-e', '-o', 'pipefail', '-c', code], server).stdout
    if 'France' in code: assert 'Paris' in out, out
    if 'curl' in code and '/chat/completions' in code and '"stream"' not in code:
        assert json.loads(out)['choices'][0]['finish_reason'] == 'stop'        # no max_tokens: the turn ends by itself

def test_the_python_examples_in_order(server):
    "The Python blocks run in one process, in order, as the notebook's cells do; each block that asks about France answers Paris."
    script = ''.join(f"print('@@block {i}@@', flush=True)\n{code.replace(BASE, server)}\n" for i, code in enumerate(PYTHON))
    out = run([sys.executable, '-c', script], server).stdout
    outputs = re.split(r'^@@block \d+@@$', out, flags=re.M)[1:]
    assert len(outputs) == len(PYTHON)
    asked = [i for i, code in enumerate(PYTHON) if QUESTION in code]
    assert len(asked) >= 2, 'the openai example, plain and streamed'
    for i in asked: assert 'Paris' in outputs[i], (PYTHON[i], outputs[i])

def test_a_chat_without_max_tokens_ends_its_turn(server):
    from openai import OpenAI
    client = OpenAI(base_url=server + '/v1', api_key='none')
    r = client.chat.completions.create(model='SmolLM2-135M-Instruct', messages=[{'role': 'user', 'content': QUESTION}])
    assert r.choices[0].finish_reason == 'stop' and 'Paris' in r.choices[0].message.content
    d = client.models.list().model_dump()['data'][0]['request_defaults']
    assert d['sampling'] == {'temperature': 0.2, 'top_p': 0.9} and d['max_tokens'] == {'chat': 'the rest of the context', 'completions': 16}
