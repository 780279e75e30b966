"Day 56, the boot path: a `--cuda-graphs` server warms its plan before /health answers and serves what an eager one serves; the plan's ceilings through the command line; `nanoserve bench boot`; `generate` and `bench offline` through `build_engine`; the module map."
import ast, contextlib, csv, json, re, subprocess, sys, tempfile
from pathlib import Path
import httpx, openai, pytest, torch, transformers
from nanoserve.loadgen import spawn_server, free_port, wait_healthy
from nanoserve.launch import build_engine, boot_lines, boot_info, check_boot_info, BootUnsound
from nanoserve.capture_plan import CaptureTooSmall
from conftest import make_tiny

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
HOST = ('--cuda-graphs', '--capture-recorder', 'host')

@pytest.fixture(scope='module')
def long_tiny(tmp_path_factory):
    "A tiny checkpoint with a 2048-token context, for the deployments of the acceptance list."
    path = tmp_path_factory.mktemp('long')
    make_tiny(path, 'llama_tied_gqa')
    cfg = json.loads((path/'config.json').read_text()); cfg['max_position_embeddings'] = 2048
    (path/'config.json').write_text(json.dumps(cfg))
    return path

def completions(url, prompts, **kw):
    client = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
    return [[c.text for c in client.completions.create(model='tiny', prompt=p, **kw).choices] for p in prompts]

def test_cuda_graphs_server_warms_before_healthy_and_matches_eager(tiny):
    path = tiny('llama_tied_gqa')
    prompts = ['hello world', 'the capital of France', 'abc', 'Paris is']
    with spawn_server(path, '--dtype', 'float32', '--max-batch-size', '4', '--served-model-name', 'tiny', *HOST) as (url, _):
        h = httpx.get(url + '/health').json()                    # the first answer it gives: the plan is already recorded
        cg = h['cuda_graphs']
        assert (cg['enabled'], cg['recorder'], cg['warm'], cg['count'], cg['recorded'], cg['width_bound_by']) == (True, 'host', True, 12, 12, 'max_model_len')
        assert (cg['max_rows'], cg['max_width'], h['max_model_len']) == (4, 512, 512) and 'warm' in h['boot']['seconds']
        assert 'max_width' not in h and h['stats']['num_running'] == 0 and h['instance']
        got = completions(url, prompts, max_tokens=24, temperature=0.8, seed=5, n=3)      # n=3: three rows decode together
        greedy = completions(url, [[5, 6, 7, 8]], max_tokens=40, temperature=0)         # token ids in, one row alone
    with spawn_server(path, '--dtype', 'float32', '--max-batch-size', '4', '--served-model-name', 'tiny') as (url, _):
        assert httpx.get(url + '/health').json()['cuda_graphs']['enabled'] is False
        assert completions(url, prompts, max_tokens=24, temperature=0.8, seed=5, n=3) == got
        assert completions(url, [[5, 6, 7, 8]], max_tokens=40, temperature=0) == greedy

@pytest.mark.parametrize('kind,recorder', [('peaky', 'compile'), ('llama_untied_mha', 'decode_call'),
                                           ('qwen3', 'decode_call')])
def test_cpu_default_recorder_server_matches_eager(tiny, peaky, kind, recorder):
    """The CPU's default recorder, chosen by device and model: the decode call where the model takes it (head size 16
    here, and Qwen3's 32 with its q/k norms), else `compile` (head size 8: no decode-attention kernel); warmed before
    serving; eager's tokens."""
    path = peaky if kind == 'peaky' else tiny(kind)
    prompts = ['hello world', 'the capital of France is', 'abc xyz']
    flags = ('--dtype', 'float32', '--max-batch-size', '2', '--max-model-len', '256', '--served-model-name', 'tiny',
             '--device', 'cpu')
    with spawn_server(path, *flags, '--cuda-graphs') as (url, _):
        cg = httpx.get(url + '/health').json()['cuda_graphs']
        assert (cg['recorder'], cg['warm'], cg['count'], cg['recorded']) == (recorder, True, 4, 4)
        got = completions(url, prompts, max_tokens=20, temperature=0, n=2)
        assert httpx.get(url + '/health').json()['cuda_graphs']['runtime']['replays'] > 0
    with spawn_server(path, *flags) as (url, _):
        assert completions(url, prompts, max_tokens=20, temperature=0, n=2) == got

@contextlib.contextmanager
def serve_logged(path, *flags):
    "A `nanoserve serve` whose boot log can be read once it is healthy."
    port, log = free_port(), tempfile.TemporaryFile('w+')
    proc = subprocess.Popen([NANOSERVE, 'serve', '--model', str(path), '--dtype', 'float32', '--port', str(port), '--served-model-name', 'tiny', *flags],
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    def text(): log.seek(0); return log.read()
    try:
        url = f'http://127.0.0.1:{port}'
        wait_healthy(url, proc, 300, log_tail=text)
        yield url, text()
    finally:
        proc.terminate(); proc.wait(30); log.close()

def test_limit_deployments_through_serve(long_tiny):
    "8 slots x 2048 sits exactly on the 64 limit; 16 slots trims the width, and the boot line says the limit bound it."
    with serve_logged(long_tiny, '--max-batch-size', '8', '--max-model-len', '2048', *HOST) as (url, log):
        cg = httpx.get(url + '/health').json()['cuda_graphs']
        assert (cg['count'], cg['trimmed'], cg['max_width'], cg['width_bound_by'], cg['recorded']) == (64, 0, 2048, 'max_model_len', 64)
        assert 'capture plan: 64 of 64 shapes (4 row buckets up to 8 x 16 widths up to 2048)' in log and 'width bound by max_model_len' in log
    with serve_logged(long_tiny, '--max-batch-size', '16', '--max-model-len', '2048', *HOST) as (url, log):
        cg = httpx.get(url + '/health').json()['cuda_graphs']
        assert (cg['count'], cg['trimmed'], cg['max_width'], cg['width_bound_by']) == (60, 20, 1536, 'capture_limit')
        assert re.search(r'capture plan: 60 of 80 shapes \(5 row buckets up to 16 x 12 widths up to 1536\).*; width bound by capture_limit', log), log
        assert 'capture warm: 60 shapes recorded before serving' in log

@pytest.mark.parametrize('flags,bound,width', [(dict(), 'capture_limit', 1536), (dict(warm_width=700), 'warm_width', 640),
                                               (dict(warm_rows=2), 'max_model_len', 2048), (dict(capture_limit=200), 'max_model_len', 2048)])
def test_each_ceiling_through_build_engine(long_tiny, flags, bound, width):
    eng = build_engine(long_tiny, max_batch_size=16, max_model_len=2048, capture_recorder='host', bucket_decode=True, persist_inputs=True,
                       capture_decode=True, warm=False, persistent_batch=False, **flags)
    assert (eng.boot.plan.width_bound_by, eng.boot.plan.max_width) == (bound, width)
    assert f'width bound by {bound}' in '\n'.join(boot_lines(eng, 'tiny'))
    check_boot_info(boot_info(eng, 'tiny'), eng)

def test_refusals_come_before_the_model_loads_and_a_lying_payload_is_refused(long_tiny):
    "The budget binding is checked on plan_capture in 56_capture_plan (a boot here always has gigabytes free)."
    capt = dict(capture_recorder='host', bucket_decode=True, persist_inputs=True, capture_decode=True, warm=False, persistent_batch=False)
    with pytest.raises(CaptureTooSmall, match='capture_limit=3 is below the 5 row buckets'):
        build_engine('/no/such/model', max_batch_size=16, max_model_len=2048, capture_limit=3, **capt)        # refused before the path is read
    eng = build_engine(long_tiny, max_batch_size=16, max_model_len=2048, **capt)
    info = boot_info(eng, 'tiny'); info['cuda_graphs']['warm'] = True
    with pytest.raises(BootUnsound, match='the payload says the capture is warm, and 60 of 60 planned shapes are cold'): check_boot_info(info, eng)

def test_bench_boot_prints_both_tables_and_writes_csv(tmp_path):
    out = subprocess.run([NANOSERVE, 'bench', 'boot', '--csv', str(tmp_path/'boot.csv')], capture_output=True, text=True, check=True).stdout
    assert 'what a deployment asks for (limit 64' in out and 'the other side of the trim' in out
    rows = list(csv.DictReader(open(tmp_path/'boot.csv')))
    assert [(r['slots'], r['context'], r['kept'], r['ceiling']) for r in rows] == [
        ('8', '2048', '64', '2048'), ('8', '4096', '64', '2048'), ('16', '2048', '60', '1536'), ('16', '8192', '60', '1536'),
        ('32', '4096', '60', '1280'), ('64', '8192', '63', '1152'), ('256', '8192', '63', '896')]
    small = subprocess.run([NANOSERVE, 'bench', 'boot', '--limit', '5', '--csv', str(tmp_path/'x.csv')], capture_output=True, text=True)
    assert small.returncode == 2 and '--limit 5 is below the 9 row buckets of the 256-slot deployment: ' in small.stderr

def test_generate_and_bench_offline_build_through_launch(tiny, tmp_path):
    "Engine.build refuses the capture flags; these commands take them, so they assemble through launch.build_engine."
    path = str(tiny('llama_tied_gqa'))
    base = [NANOSERVE, 'generate', '--model', path, '--dtype', 'float32', '--json', '--max-tokens', '16', '--max-batch-size', '4', 'hello world', 'abc']
    want = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    got = subprocess.run(base + list(HOST), capture_output=True, text=True, check=True).stdout
    assert [json.loads(l)['token_ids'] for l in got.splitlines()] == [json.loads(l)['token_ids'] for l in want.splitlines()]
    r = subprocess.run([NANOSERVE, 'bench', 'offline', '--model', path, '--dtypes', 'float32', '--num-requests', '4', '--prompt-len', '4:8',
                        '--output-len', '8', '--batch1-requests', '1', '--max-batch-size', '4', '--csv', str(tmp_path/'o.csv'), *HOST],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [row['batch'] for row in csv.DictReader(open(tmp_path/'o.csv'))] == ['4', '1']

def test_device_flag(tiny):
    r = subprocess.run([NANOSERVE, 'serve', '--model', str(tiny('llama_tied_gqa')), '--dtype', 'float32', '--device', 'tpu'], capture_output=True, text=True)
    assert r.returncode == 2 and "device must be 'cpu' or 'cuda', got 'tpu'" in r.stderr
    if not torch.cuda.is_available():
        r = subprocess.run([NANOSERVE, 'generate', '--model', str(tiny('llama_tied_gqa')), '--dtype', 'float32', '--device', 'cuda', 'hi'], capture_output=True, text=True)
        assert r.returncode == 2 and 'use --device cpu' in r.stderr

ROOT = Path(__file__).resolve().parent.parent

def module_days() -> dict[str, float]:
    "module -> its day on the build log, read from each notebook's name and its default_exp."
    days = {}
    for nb in (ROOT/'nbs').glob('[0-9]*.ipynb'):
        src = ''.join(''.join(c['source']) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code')
        if m := re.search(r'#\|\s*default_exp\s+(\w+)', src): days[m.group(1)] = int(nb.name.split('_')[0])
    return days

def imports_of(path: Path) -> set[str]:
    "Every nanoserve module `path` imports, at the top or inside a function."
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ''
            if node.level == 1: out.add(mod.split('.')[0] if mod else '')
            elif mod.startswith('nanoserve.'): out.add(mod.split('.')[1])
            if (node.level == 1 and not mod) or mod == 'nanoserve': out |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split('.')[1] for a in node.names if a.name.startswith('nanoserve.')}
    return out - {''}

def test_imports_point_down_the_module_map():
    days = module_days()
    assert days['engine'] == 20 and days['launch'] == 56 and days['capture_plan'] == 56 and days['cli'] == 90
    up = [(m, days[m], i, days[i]) for m in days for i in imports_of(ROOT/'nanoserve'/f'{m}.py') if i in days and days[i] > days[m]]
    assert up == [], f"earlier days import later ones: {up}"
    same = [(m, i) for m in days for i in imports_of(ROOT/'nanoserve'/f'{m}.py') if i in days and days[i] == days[m] and m in imports_of(ROOT/'nanoserve'/f'{i}.py')]
    assert same == [], f"import cycles: {same}"
    assert 'cli' not in imports_of(ROOT/'nanoserve'/'serve.py') and 'cli' not in imports_of(ROOT/'nanoserve'/'launch.py')

def test_default_dtype_is_the_machines_and_says_why(tiny):
    "No --dtype: the machine's choice (bfloat16 with avx512_bf16 or amx_bf16, else float32), named with its reason on /health and the boot line."
    from nanoserve.core import auto_dtype, cpu_flags
    path = tiny('llama_tied_gqa')
    want, why = auto_dtype('cpu')
    assert want == ('bfloat16' if {'avx512_bf16', 'amx_bf16'} & cpu_flags() else 'float32')
    with spawn_server(path, '--max-batch-size', '2', '--device', 'cpu', '--served-model-name', 'tiny') as (url, _):
        h = httpx.get(url + '/health').json()
        assert (h['dtype'], h['dtype_reason']) == (want, why)
        assert completions(url, ['hello'], max_tokens=4, temperature=0)[0][0] is not None
    with spawn_server(path, '--max-batch-size', '2', '--device', 'cpu', '--dtype', 'float16') as (url, _):
        h = httpx.get(url + '/health').json()
        assert (h['dtype'], h['dtype_reason']) == ('float16', 'asked for (--dtype)')
    eng = build_engine(path, max_batch_size=2, device='cpu')
    assert f"{want} ({why})" in boot_lines(eng, 'tiny')[0] and str(eng.model.dtype) == f'torch.{want}' and eng.cache.k.dtype == eng.model.dtype
    r = subprocess.run([NANOSERVE, 'generate', '--model', str(path), '--dtype', 'int4', 'hi'], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown dtype 'int4'" in r.stderr
