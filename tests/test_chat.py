"`nanoserve chat` driven as a user drives it: lines on its stdin (two turns, /reset, /quit), offline and against a live server with --url; and through a pseudo-terminal."
import os, pty, select, signal, subprocess, sys, time
from pathlib import Path
from typing import Callable
import httpx, pytest
from nanoserve.tiny import tiny_checkpoint, CHAT_SPECIALS
from nanoserve.engine import Engine
from nanoserve.sampling import SamplingParams
from nanoserve.loadgen import spawn_server
from nanoserve.chat import STOPPED, CHAT_DEFAULTS

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
    """What the conversation must print: each answer is the engine's greedy answer to the messages of that moment (the history
    kept, then cleared), with the REPL's own sampling defaults (CHAT_DEFAULTS: the tiny model has no generation_config.json)."""
    engine = Engine.build(chat_model, dtype='float32')
    def g(msgs, **chat):
        return engine.generate([msgs], SamplingParams(temperature=0, max_tokens=6, **chat), use_tqdm=False)[0].text
    a1 = g([{'role': 'user', 'content': 'hello'}], **CHAT_DEFAULTS)
    second = [{'role': 'user', 'content': 'hello'}, {'role': 'assistant', 'content': a1}, {'role': 'user', 'content': 'and then?'}]
    a2 = g(second, **CHAT_DEFAULTS)
    a3 = g([{'role': 'user', 'content': 'and then?'}], **CHAT_DEFAULTS)
    assert a2 != a3, 'the tiny model must answer differently with and without the history, or the test shows nothing'
    assert a2 != g(second), "the REPL's defaults must change an answer here, or the test cannot see them applied"
    return f"{a1}\n{a2}\n(conversation cleared)\n{a3}\n"

def chat(*args, stdin=SCRIPT):
    return subprocess.run([NANOSERVE, 'chat', *args], input=stdin, capture_output=True, text=True, timeout=300)

def test_offline_two_turns_reset_quit(chat_model, expected):
    r = chat('--model', str(chat_model), '--dtype', 'float32', *FLAGS)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected
    assert 'offline' in r.stderr and '/reset' in r.stderr and "'repetition_penalty': 1.1" in r.stderr

def test_the_users_flag_wins_over_the_repls_default(chat_model, expected):
    "--repetition-penalty 1 turns the REPL's default off: the answers are the plain greedy ones, which differ from `expected`'s."
    r = chat('--model', str(chat_model), '--dtype', 'float32', *FLAGS, '--repetition-penalty', '1')
    assert r.returncode == 0 and "'repetition_penalty': 1.0" in r.stderr, r.stderr
    assert r.stdout != expected

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

class Terminal:
    """`nanoserve chat` on a pseudo-terminal, as a user at a terminal runs it: what it prints is read until a marker appears
    (synchronised on its output, never on time); keys are written as a terminal sends them (Ctrl-C is byte 3, which the
    terminal turns into SIGINT for the program)."""
    def __init__(self, *args: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            # as a shell starts a program: Ctrl-C's SIGINT at its default and unblocked, whatever the test process (a pytest
            # worker, or a library it loaded) did to its own (an ignored or blocked SIGINT survives exec, and Python then
            # installs no KeyboardInterrupt handler: the answer would stream past Ctrl-C to its end)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            os.execv(NANOSERVE, [NANOSERVE, 'chat', *args])
        self.seen = b''

    def read_until(self, marker: bytes, start: int = 0) -> int:
        "Read until `marker` appears at or after offset `start` of the output; its offset (-1: the program ended first)."
        while (at := self.seen.find(marker, start)) < 0:
            ready, _, _ = select.select([self.fd], [], [], 120)
            assert ready, f'no output while waiting for {marker!r}; got {self.seen[-500:]!r}'
            try: chunk = os.read(self.fd, 4096)
            except OSError: return -1
            if not chunk: return -1
            self.seen += chunk
        return at

    def read_more(self, after: int) -> int:
        "Read until the output is longer than `after` bytes (an answer has begun); its new length."
        while len(self.seen) <= after:
            ready, _, _ = select.select([self.fd], [], [], 120)
            assert ready, f'nothing printed after byte {after}; got {self.seen[-500:]!r}'
            self.seen += os.read(self.fd, 4096)
        return len(self.seen)

    def write(self, keys: bytes): os.write(self.fd, keys)

    def close(self, kill: bool = False) -> int:
        "The exit status once the program ends by itself, or once killed (a failed test leaves nothing behind)."
        if self.fd < 0: return self.status
        if kill: os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        self.fd, self.status = -1, os.waitstatus_to_exitcode(status)
        return self.status

    def __enter__(self): return self
    def __exit__(self, kind, *_): self.close(kill=kind is not None)

def test_through_a_pseudo_terminal(chat_model, expected):
    "On a terminal it shows the '> ' prompt and streams each answer; /quit ends it."
    with Terminal('--model', str(chat_model), '--dtype', 'float32', *FLAGS) as t:
        t.read_until(b'> ')
        t.write(b'hello\n')
        first = expected.split('\n')[0].encode()
        t.read_until(first + b'\r\n> ')                 # the answer, then the next prompt
        t.write(b'/quit\n')
        t.read_until(b'\x00')                            # no such byte: read until the child exits and the terminal closes
    assert t.close() == 0

# a tiny model with a long context and no end-of-sequence token: an answer with no max_tokens runs for thousands of tokens,
# long past the keys the tests send while it streams
LONG_CONTEXT = '16384'

@pytest.fixture(scope='module')
def long_model(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp('long'), 0, corpus=['hello there, the capital of France is Paris'], special_tokens=CHAT_SPECIALS,
                           chat_template=CHATML, max_position_embeddings=int(LONG_CONTEXT), eos_token_id=None, bos_token_id=None,
                           vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

def stop_an_answer(t: Terminal, question: bytes, typed_ahead: bytes = b'',
                   running: Callable[[], bool] | None = None) -> bytes:
    """Ask `question` at the prompt, wait until its answer streams, type `typed_ahead` during it, press Ctrl-C; what the
    answer printed before the stop. `running`: where a server answers, a check that it holds the request, which must
    hold (and more of the answer print) before Ctrl-C is sent: the line editor has then surely given the terminal back
    (a Ctrl-C it catches itself reaches Python only with its next key, after the answer)."""
    t.write(question + b'\n')
    asked = t.read_until(question + b'\r\n')
    begun = t.read_more(asked + len(question) + 2)
    if running is not None:
        deadline = time.monotonic() + 120                # bounds a failure only
        while not running():
            assert time.monotonic() < deadline, f'the server never ran the question: {t.seen[asked:][:500]!r}'
        begun = t.read_more(len(t.seen))
    if typed_ahead: t.write(typed_ahead)
    t.write(b'\x03')
    stopped = t.read_until(STOPPED.encode(), begun)
    assert stopped > 0, f'the program ended instead of stopping the answer: {t.seen[-500:]!r}'
    return t.seen[begun:stopped]

def test_ctrl_c_stops_a_local_answer_and_keeps_what_was_typed(long_model):
    """Ctrl-C during an answer stops it and returns to the prompt; a line typed while the answer streamed is neither echoed
    into it nor lost (it is the next question); Ctrl-D leaves. (Ctrl-C at the prompt is checked in nbs/61_chat.ipynb: sent
    the instant a prompt shows, it can reach the program before Python's line editor waits for keys, and CPython then sees
    it only with the next key.)"""
    with Terminal('--model', str(long_model), '--dtype', 'float32', '--temperature', '0', '--max-model-len', LONG_CONTEXT) as t:
        assert t.read_until(b'> ') >= 0
        streamed = stop_an_answer(t, b'hello', typed_ahead=b'and then?\n')
        assert b'and then?' not in streamed, streamed[-300:]       # not echoed into the answer
        at = t.read_until(b'> and then?\r\n')                     # shown at the next prompt, and sent
        t.read_more(at + 20)                                        # its answer streams
        t.write(b'\x03')
        t.read_until(STOPPED.encode(), at)
        t.read_until(b'> ', t.seen.rfind(STOPPED.encode()))
        t.write(b'\x04')                                           # Ctrl-D leaves (Ctrl-C at the prompt: the notebook)
        t.read_until(b'\x00')
    assert t.close() == 0

def health_stats(url: str) -> dict: return httpx.get(url + '/health', timeout=30).json()['stats']

def test_ctrl_c_with_url_closes_the_stream_and_the_server_aborts(long_model):
    """With --url, Ctrl-C closes the answer's stream: the server aborts the request (its /health counts it, nothing runs), and
    the conversation goes on against the same server."""
    with spawn_server(long_model, '--dtype', 'float32', '--max-model-len', LONG_CONTEXT) as (url, _):
        with Terminal('--url', url, '--temperature', '0') as t:
            assert t.read_until(b'> ') >= 0
            stop_an_answer(t, b'hello', running=lambda: health_stats(url)['num_running'] == 1)
            t.read_until(b'> ', t.seen.rfind(STOPPED.encode()))
            # synchronised on the server's own counters: the abort reaches its engine once the closed stream is noticed (the
            # deadline only bounds a failure; a reading may fall between the engine's abort and its count)
            deadline = time.monotonic() + 120
            while (s := health_stats(url))['num_aborted'] < 1 or s['num_running']:
                assert s['num_running'] <= 1 and s['num_aborted'] <= 1 and time.monotonic() < deadline, s
            assert s['num_waiting'] == 0 and s['num_aborted'] == 1, s
            t.write(b'/quit\n')
            t.read_until(b'\x00')
        assert t.close() == 0
        assert health_stats(url)['num_aborted'] == 1

def test_ctrl_c_in_a_local_turn_ends_it_after_the_step_under_way(long_model):
    """In process: the turn's SIGINT handler only records Ctrl-C, and the turn stops at the end of the step under way (no step
    is cut in half), aborts its request with every KV block back in the pool, and puts the handler before it back."""
    from nanoserve.chat import local_turn
    engine = Engine.build(long_model, dtype='float32', max_model_len=int(LONG_CONTEXT))
    free, before = engine.cache.pool.num_free, signal.getsignal(signal.SIGINT)
    turn = local_turn(engine, [{'role': 'user', 'content': 'hello'}], {'temperature': 0.0})
    next(turn)                                        # the answer has begun
    steps = engine.num_steps
    os.kill(os.getpid(), signal.SIGINT)               # what Ctrl-C sends the program
    with pytest.raises(KeyboardInterrupt):
        for _ in turn: pass
    assert engine.num_steps - steps <= 1
    assert not engine.has_unfinished() and engine.cache.pool.num_free == free
    assert signal.getsignal(signal.SIGINT) is before
