"""Day 64, models by their Hub name: a local server that speaks the Hub's file API (tests/hubserver.py, HF_ENDPOINT)
serves tiny random checkpoints. `nanoserve serve owner/name` downloads once into HF_HOME and serves; a second start with
HF_HUB_OFFLINE=1 serves from the cache without a request, and transformers loads the same download offline; revisions
and sharded checkpoints resolve; each refusal comes with its message before any weight is sent; a cut connection resumes
with a Range request, and a killed download leaves no broken file where the loader reads."""
import json, os, shutil, subprocess, sys, threading
from pathlib import Path
import openai, pytest, transformers
from conftest import make_tiny
from hubserver import LocalHub, commit_sha
from nanoserve.loadgen import spawn_server

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')

@pytest.fixture(scope='module')
def hub(tmp_path_factory):
    "One local Hub for the module, serving: acme/tiny (main and v2), acme/sharded, and the repos the refusals need."
    root = tmp_path_factory.mktemp('hub')
    h = LocalHub()
    main = make_tiny(root/'tiny', 'llama_tied_gqa')
    # what a Hub repo holds beside a checkpoint, and nanoserve never reads
    (main/'README.md').write_text('# tiny\n')
    shutil.copy(main/'model.safetensors', main/'pytorch_model.bin')
    (main/'onnx').mkdir()
    (main/'onnx'/'model.onnx').write_bytes(b'onnx' * 1000)
    h.add('acme/tiny', main)
    h.add('acme/tiny', make_tiny(root/'tiny-v2', 'llama_tied_gqa', seed=5), revision='v2')
    h.add('acme/gated', main, gated=True)
    sharded = root/'sharded'
    shutil.copytree(main, sharded)
    model = transformers.AutoModelForCausalLM.from_pretrained(main)
    (sharded/'model.safetensors').unlink()
    model.save_pretrained(sharded, max_shard_size='100KB')
    h.add('acme/sharded', sharded)
    arch = root/'gpt2'
    shutil.copytree(main, arch)
    cfg = json.loads((arch/'config.json').read_text())
    (arch/'config.json').write_text(json.dumps(cfg | {'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2'}))
    h.add('acme/gpt2', arch)
    bin_only = root/'bin-only'
    shutil.copytree(main, bin_only)
    (bin_only/'model.safetensors').unlink()                                    # a listing with .bin weights only
    h.add('acme/bin-only', bin_only)
    huge = root/'huge'
    shutil.copytree(sharded, huge)
    index = json.loads((huge/'model.safetensors.index.json').read_text())
    index['metadata']['total_size'] = 10**15                                    # a petabyte of weights
    (huge/'model.safetensors.index.json').write_text(json.dumps(index))
    h.add('acme/huge', huge)
    h.url = h.start()
    yield h
    h.stop()

def hub_env(hub, home: Path, **extra) -> dict:
    return {'HF_ENDPOINT': hub.url, 'HF_HOME': str(home), 'HF_HUB_OFFLINE': '0', 'HF_TOKEN': '',
            'HF_HUB_DISABLE_TELEMETRY': '1'} | extra

def nanoserve(hub, home, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([NANOSERVE, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **hub_env(hub, home, **env)})

def generate(hub, home, model, *flags, **env) -> list[int]:
    r = nanoserve(hub, home, 'generate', '--model', model, '--dtype', 'float32', '--max-tokens', '12', '--json',
                  *flags, 'the capital of', **env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)['token_ids']

def test_serve_downloads_once_then_serves_offline(hub, tmp_path):
    home = tmp_path/'hf'
    before = len(hub.seen)
    answers = []
    for offline in ('0', '1'):
        env = hub_env(hub, home, HF_HUB_OFFLINE=offline)
        with spawn_server('acme/tiny', '--dtype', 'float32', env=env) as (url, _):
            client = openai.OpenAI(base_url=f'{url}/v1', api_key='x')
            assert [m.id for m in client.models.list().data] == ['acme/tiny']
            r = client.completions.create(model='acme/tiny', prompt='the capital of', max_tokens=8, temperature=0)
            answers.append(r.choices[0].text)
        if offline == '0':
            online = hub.seen[before:]
            weights = [s.path for s in online if s.method == 'GET' and s.path.endswith('.safetensors')]
            assert weights == [f"/acme/tiny/resolve/{commit_sha('acme/tiny@main')}/model.safetensors"]  # once
            assert not [s for s in online if s.method == 'GET' and s.path.endswith(('.bin', '.onnx', 'README.md'))]
    # the cache is the one transformers reads: it loads the download offline, without a request either
    code = "import transformers; print(transformers.AutoModelForCausalLM.from_pretrained('acme/tiny').num_parameters())"
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **hub_env(hub, home, HF_HUB_OFFLINE='1')})
    assert r.returncode == 0 and int(r.stdout.split()[-1]) > 0, r.stderr
    assert hub.seen[before + len(online):] == []                                      # offline: not one request
    assert answers[0] == answers[1] and len(answers[0]) > 0
    snap = home/'hub'/'models--acme--tiny'/'snapshots'/commit_sha('acme/tiny@main')
    source = hub.repos['acme/tiny'].commits[commit_sha('acme/tiny@main')]
    assert sorted(p.name for p in snap.iterdir()) == sorted(p.name for p in source.iterdir()
                                                            if p.name not in ('README.md', 'pytorch_model.bin', 'onnx'))

def test_revisions_and_sharded_checkpoints(hub, tmp_path):
    home = tmp_path/'hf'
    r = nanoserve(hub, home, 'pull', 'acme/tiny', '--revision', 'v2')
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).name == commit_sha('acme/tiny@v2')
    main, v2 = generate(hub, home, 'acme/tiny'), generate(hub, home, 'acme/tiny', '--revision', 'v2')
    assert main != v2                                                                 # two models, not one twice
    assert generate(hub, home, str(hub.repos['acme/tiny'].commits[commit_sha('acme/tiny@v2')])) == v2
    shards = hub.repos['acme/sharded'].commits[commit_sha('acme/sharded@main')]
    assert len(list(shards.glob('model-*.safetensors'))) > 1
    assert generate(hub, home, 'acme/sharded') == main                                # the same weights, in shards
    r = nanoserve(hub, home, 'pull', 'acme/tiny', '--revision', 'v9')
    assert r.returncode == 2 and "acme/tiny has no revision 'v9': pass a branch, tag or commit" in r.stderr
    r = nanoserve(hub, home, 'generate', '--model', str(shards), '--revision', 'v2', 'hi')
    assert r.returncode == 2 and '--revision picks a revision of a Hugging Face Hub model' in r.stderr

@pytest.mark.parametrize('repo, says', [
    ('acme/gpt2', "acme/gpt2: unsupported architectures ['GPT2LMHeadModel'] in config.json; nanoserve serves"),
    ('acme/bin-only', 'acme/bin-only has no safetensors weights (it has pytorch_model.bin): nanoserve reads '
                      'safetensors only'),
    ('acme/gated', 'acme/gated is gated: accept its terms at'),
    ('acme/huge', "acme/huge's weights take at least"),
    ('acme/nothing', "--model 'acme/nothing' is not a local directory, and http://127.0.0.1"),
])
def test_refusals_come_before_any_weight(hub, tmp_path, repo, says):
    home = tmp_path/'hf'
    before = len(hub.seen)
    r = nanoserve(hub, home, 'serve', '--model', repo, '--port', '0')
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert 'Traceback' not in r.stderr
    sent = [s.path for s in hub.seen[before:] if s.method == 'GET' and s.path.endswith(('.safetensors', '.bin'))]
    assert sent == []                                                                 # nothing large was fetched
    assert not list(home.glob('hub/**/*.safetensors'))

def test_gated_with_a_token_and_offline_without_a_cache(hub, tmp_path):
    home = tmp_path/'hf'
    r = nanoserve(hub, home, 'pull', 'acme/gated', HF_TOKEN='hf_wrong')
    assert r.returncode == 2 and 'set HF_TOKEN to an access token' in r.stderr
    r = nanoserve(hub, home, 'pull', 'acme/gated', HF_TOKEN=hub.token)
    assert r.returncode == 0 and (Path(r.stdout.strip())/'model.safetensors').is_file(), r.stderr
    assert {s.token for s in hub.seen if '/acme/gated/resolve/' in s.path and s.method == 'GET'} == {hub.token}
    r = nanoserve(hub, tmp_path/'empty', 'pull', 'acme/tiny', HF_HUB_OFFLINE='1')
    assert r.returncode == 2 and 'HF_HUB_OFFLINE is set and acme/tiny is not in the Hugging Face cache' in r.stderr

def test_a_cut_connection_resumes_with_a_range_request(hub, tmp_path):
    """The library reads 10 MiB at a time: a checkpoint of about 19 MB, cut after 11 MB, resumes from 10 MiB."""
    medium = make_tiny(tmp_path/'medium', 'llama_tied_gqa', seed=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(medium)
    cfg = model.config.to_dict() | dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                         num_attention_heads=8, num_key_value_heads=4, head_dim=64)
    big = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**cfg))
    big.save_pretrained(medium)
    size = (medium/'model.safetensors').stat().st_size
    assert size > 12 * 2**20
    hub.add('acme/medium', medium)
    hub.cut['model.safetensors'] = 11 * 2**20
    home = tmp_path/'hf'
    r = nanoserve(hub, home, 'pull', 'acme/medium')
    assert r.returncode == 0, r.stderr
    gets = [s for s in hub.seen if s.method == 'GET' and s.path.startswith('/acme/medium/') and
            s.path.endswith('model.safetensors')]
    assert [g.range for g in gets] == [None, f'bytes={10 * 2**20}-']
    assert (Path(r.stdout.strip())/'model.safetensors').read_bytes() == (medium/'model.safetensors').read_bytes()

def test_a_killed_download_leaves_no_broken_file_and_starts_again(hub, tmp_path):
    """A pull killed in the middle of the weights: nothing in the snapshot the loader reads (the partial file is the
    library's temporary one, under blobs/), and the next pull fetches the file whole, from its first byte."""
    stalled, release = threading.Event(), threading.Event()
    hub.stall['model.safetensors'] = (200_000, stalled, release)
    home = tmp_path/'hf'
    proc = subprocess.Popen([NANOSERVE, 'pull', 'acme/tiny'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **hub_env(hub, home)})
    try:
        assert stalled.wait(120), 'the download never reached the stall'
        proc.kill()
        proc.wait(60)
    finally: release.set()
    snap = home/'hub'/'models--acme--tiny'/'snapshots'/commit_sha('acme/tiny@main')
    assert (snap/'config.json').is_file() and not (snap/'model.safetensors').exists()
    whole = hub.repos['acme/tiny'].commits[commit_sha('acme/tiny@main')]/'model.safetensors'
    blobs = [p for p in home.glob('hub/models--acme--tiny/blobs/*') if not p.name.endswith('.incomplete')]
    assert all(p.stat().st_size < whole.stat().st_size for p in blobs)              # no blob of the weights' size
    before = len(hub.seen)
    r = nanoserve(hub, home, 'pull', 'acme/tiny')
    assert r.returncode == 0, r.stderr
    assert (Path(r.stdout.strip())/'model.safetensors').read_bytes() == whole.read_bytes()
    assert [s.range for s in hub.seen[before:] if s.method == 'GET' and s.path.endswith('model.safetensors')] == [None]
