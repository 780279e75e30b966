"`nanoserve chat` driven as a user drives it: lines on its stdin (two turns, /reset, /quit), offline and against a live server with --url; and through a pseudo-terminal."
import os, pty, select, signal, subprocess, sys
from pathlib import Path
import pytest
from nanoserve.tiny import tiny_checkpoint, CHAT_SPECIALS
from nanoserve.engine import Engine
from nanoserve.sampling import SamplingParams
from nanoserve.loadgen import spawn_server

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
FLAGS = ['--temperature', '0', '--max-tokens', '6']
SCRIPT = 'hello\nand then?\n/reset\nand then?\n/quit\nnever read\n'

@pytest.fixture(scope='module')
def chat_model(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp('chat'), 0, corpus=['hello there, the capital of France is Paris'], special_tokens=CHAT_SPECIALS,
                           chat_template=CHATML, max_position_embeddings=256, eos_token_id=None, bos_token_id=None,
                           vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

@pytest.fixture(scope='module')
def expected(chat_model):
    "What the conversation must print: each answer is the engine's greedy answer to the messages of that moment (the history kept, then cleared)."
    engine = Engine.build(chat_model, dtype='float32')
    g = lambda msgs: engine.generate([msgs], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0].text
    a1 = g([{'role': 'user', 'content': 'hello'}])
    a2 = g([{'role': 'user', 'content': 'hello'}, {'role': 'assistant', 'content': a1}, {'role': 'user', 'content': 'and then?'}])
    a3 = g([{'role': 'user', 'content': 'and then?'}])
    assert a2 != a3, 'the tiny model must answer differently with and without the history, or the test shows nothing'
    return f"{a1}\n{a2}\n(conversation cleared)\n{a3}\n"

def chat(*args, stdin=SCRIPT):
    return subprocess.run([NANOSERVE, 'chat', *args], input=stdin, capture_output=True, text=True, timeout=300)

def test_offline_two_turns_reset_quit(chat_model, expected):
    r = chat('--model', str(chat_model), '--dtype', 'float32', *FLAGS)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected
    assert 'offline' in r.stderr and '/reset' in r.stderr

def test_with_url_against_a_live_server(chat_model, expected):
    with spawn_server(chat_model, '--dtype', 'float32', '--max-model-len', '256') as (url, _):
        r = chat('--url', url + '/v1', *FLAGS)
        assert r.returncode == 0, r.stderr
        assert r.stdout == expected
        assert f'chatting with {chat_model.name} at {url}/v1' in r.stderr        # the first served model, as vllm chat picks it
        wrong = chat('--url', url, '--model', 'nope', stdin='hello\n')
        assert wrong.returncode == 0 and "error: the server answered 404: model 'nope' is not served here" in wrong.stdout

def test_unreachable_url_is_said_in_words():
    from nanoserve.loadgen import free_port
    r = chat('--url', f'http://127.0.0.1:{free_port()}', stdin='hello\n')
    assert r.returncode == 2 and 'is a server running there?' in r.stderr and 'Traceback' not in r.stderr

def test_through_a_pseudo_terminal(chat_model, expected):
    "On a terminal it shows the '> ' prompt and streams each answer; /quit ends it."
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(NANOSERVE, [NANOSERVE, 'chat', '--model', str(chat_model), '--dtype', 'float32', *FLAGS])
    seen = b''
    def read_until(marker: bytes):
        nonlocal seen
        while marker not in seen:
            ready, _, _ = select.select([fd], [], [], 120)
            assert ready, f'no output while waiting for {marker!r}; got {seen[-500:]!r}'
            try: chunk = os.read(fd, 4096)
            except OSError: break
            if not chunk: break
            seen += chunk
    try:
        read_until(b'> ')
        os.write(fd, b'hello\n')
        first = expected.split('\n')[0].encode()
        read_until(first + b'\r\n> ')                 # the answer, then the next prompt
        os.write(fd, b'/quit\n')
        read_until(b'\x00')                           # no such byte: read until the child exits and the terminal closes
    except BaseException:
        os.kill(pid, signal.SIGKILL)                  # a failed wait leaves no chat process behind (and waitpid below cannot hang)
        raise
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
