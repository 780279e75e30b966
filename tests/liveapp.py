"""An app from `build_app` served by uvicorn on 127.0.0.1 in a thread of the test process, so a test can steer its engine
(force the tokens a step appends) while real clients talk to it over real sockets."""
import contextlib, json, socket, threading, time
from pathlib import Path
import httpx, uvicorn
from tokenizers import Tokenizer
from conftest import make_tiny

# Qwen3's template, cut to what it does with `enable_thinking`: false writes an empty thought into the prompt
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")

def thinking_checkpoint(path: Path) -> tuple[Path, int]:
    """The tiny Qwen3 with that template, room for a tools prompt (2,048 positions), and <|im_end|> as its end of turn;
    (its directory, that token's id)."""
    path = make_tiny(path, 'qwen3')
    (path/'tokenizer_config.json').write_text(json.dumps({'chat_template': TEMPLATE}))
    cfg = json.loads((path/'config.json').read_text())
    (path/'config.json').write_text(json.dumps({**cfg, 'max_position_embeddings': 2048}))
    eos = Tokenizer.from_file(str(path/'tokenizer.json')).token_to_id('<|im_end|>')
    (path/'generation_config.json').write_text(json.dumps({'eos_token_id': eos}))
    return path, eos

@contextlib.contextmanager
def served(app, timeout: float = 60.0):
    "Serve `app` on a free port of 127.0.0.1; yield its base URL once /health answers; stop it after."
    sock = socket.create_server(('127.0.0.1', 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level='warning'))
    thread = threading.Thread(target=server.run, kwargs={'sockets': [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not server.started:            # uvicorn's own flag: set once it listens
            assert thread.is_alive() and time.monotonic() < deadline, 'uvicorn did not start'
            time.sleep(0.005)
        assert httpx.get(url + '/health', timeout=timeout).status_code == 200
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()

def force_text(engine, ids: list[int]):
    "Make every request's i-th sampled token `ids[i]` (its scheduler, runner and detokenizer run as they would)."
    real = engine.runner.execute
    def execute(out):
        got = real(out)
        for i, rid in enumerate(got.req_ids):
            n = len(engine.scheduler.requests[rid].output_token_ids)
            got.token_ids[i] = ids[min(n, len(ids) - 1)]
        return got
    engine.runner.execute = execute
    return real
