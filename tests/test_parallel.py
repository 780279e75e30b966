"""Day 19, tensor parallelism: greedy tokens equal the single-process engine's offline and through the server (the tiny model on 2 ranks,
the default model on 3), sizes that do not split a model are refused before any process starts, each rank holds its share of the weights
and of the KV pool, a worker that dies fails what is in flight and turns /health to 503, and the torchrun recipe runs on loopback."""
import json, os, signal, subprocess, sys
from pathlib import Path
import httpx, openai, pytest, torch
from nanoserve.core import ConfigError
from nanoserve.engine import Engine
from nanoserve.launch import build_engine
from nanoserve.loadgen import spawn_server, free_port, wait_healthy
from nanoserve.parallel import load_sharded, tensor_parallel_sizes, WorkerDied
from nanoserve.config import ModelConfig
from nanoserve.sampling import SamplingParams
from nanoserve.weights import weight_bytes

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 33], list(range(40, 110)), [3] * 20]     # the 70-token one is prefilled in chunks below

def children() -> set[int]:
    "The pids of this process's live children, from each process's /proc/PID/stat (its parent is the fourth field)."
    out = set()
    for d in Path('/proc').iterdir():
        if not d.name.isdigit(): continue
        try: stat = (d/'stat').read_text()
        except OSError: continue                                           # it exited while we looked
        fields = stat[stat.rindex(')') + 2:].split()                       # after the command name, which may hold spaces
        if int(fields[1]) == os.getpid() and fields[0] != 'Z': out.add(int(d.name))
    return out

def tokens(engine, prompts, params):
    return [o.token_ids for o in engine.generate(prompts, params, use_tqdm=False)]

@pytest.mark.parametrize('kind', ['peaky', 'llama_attention_bias', 'qwen2_bias', 'qwen3', 'qwen3_moe', 'mixtral'])
def test_two_ranks_equal_one_offline(tiny, peaky, kind):
    "Greedy and seeded sampling, chunked prefill (32-token budget) and a 4-row batch: token for token what one process gives (float32)."
    path = peaky if kind == 'peaky' else tiny(kind)
    kw = dict(dtype='float32', max_batch_size=4, max_num_batched_tokens=32)
    greedy, seeded = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True), SamplingParams(max_tokens=16, temperature=0.7, seed=4, ignore_eos=True)
    one = Engine.build(path, **kw)
    want = tokens(one, PROMPTS, greedy), tokens(one, PROMPTS, seeded) if kind == 'peaky' else None
    two = Engine.build(path, **kw, tensor_parallel_size=2)
    try:
        assert two.model.config.num_attention_heads * 2 == one.model.config.num_attention_heads
        assert (tokens(two, PROMPTS, greedy), tokens(two, PROMPTS, seeded) if kind == 'peaky' else None) == want
        assert len({tuple(t) for t in want[0]}) > 1                        # the prompts do not all give the same tokens
    finally: two.close()
    assert all(p.returncode == 0 for p in two.runner.tp.workers)           # told to stop, and stopped

def test_default_model_three_ranks_equal_one_offline(default_model):
    msgs = [[{'role': 'user', 'content': q}] for q in ("What is the capital of France?", "Write a haiku about the sea.", "Who wrote Hamlet?")]
    greedy = SamplingParams(max_tokens=32, temperature=0)
    one = Engine.build(default_model, dtype='float32', max_batch_size=4)
    want = one.generate(msgs, greedy, use_tqdm=False)
    three = Engine.build(default_model, dtype='float32', max_batch_size=4, tensor_parallel_size=3)
    try: got = three.generate(msgs, greedy, use_tqdm=False)
    finally: three.close()
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert 'Paris' in got[0].text

def test_sizes_that_do_not_split_are_refused_before_any_process(default_model, tiny):
    assert tensor_parallel_sizes(ModelConfig.from_dir(default_model)) == [1, 3]
    before = children()
    with pytest.raises(ConfigError, match='sizes that work: 1, 3'): load_sharded(default_model, 2)
    with pytest.raises(ConfigError, match='sizes that work: 1, 2'): Engine.build(tiny('llama_tied_gqa'), tensor_parallel_size=4)
    with pytest.raises(ConfigError, match="OlmoeForCausalLM's q and k norms each run over all heads"):
        Engine.build(tiny('olmoe'), tensor_parallel_size=2)
    assert children() == before                                            # nothing was started
    r = subprocess.run([NANOSERVE, 'generate', '--model', str(default_model), '--tensor-parallel-size', '2', 'hi'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and '--tensor-parallel-size 2 does not split this model' in r.stderr and 'sizes that work: 1, 3' in r.stderr
    for flags, fragment in ((['--cuda-graphs'], 'runs the eager forward'), (['--compile'], 'runs the eager forward')):
        r = subprocess.run([NANOSERVE, 'generate', '--model', str(default_model), '--tensor-parallel-size', '3', *flags, 'hi'],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and fragment in r.stderr, r.stderr

def test_each_rank_holds_half_the_weights_and_kv(tiny):
    """Every rank's parameters (gathered from the ranks themselves) and the KV pool with 2 ranks against one process, under the same
    memory budget: the same number of blocks (the same tokens), half the bytes on each rank."""
    path = tiny('llama_attention_bias')
    kw = dict(dtype='float32', max_batch_size=8, kv_cache_gb=1 / 1024)          # 1 MiB: the budget binds (85 blocks), not the rows (256)
    one = build_engine(path, **kw)
    two = build_engine(path, **kw, tensor_parallel_size=2)
    try:
        whole = dict(one.model.named_parameters())
        replicated = sum(p.numel() * 4 for n, p in whole.items() if n.endswith(('norm.weight', 'o_proj.bias', 'down_proj.bias')))
        half = (weight_bytes(one.model) - replicated) // 2 + replicated           # 320-token vocabulary: no padding
        assert two.model.tensor_parallel.weight_bytes == [half, half] and weight_bytes(two.model) == half
        assert one.plan.source == 'kv_cache_gb' and one.plan.num_blocks < 8 * 32
        assert two.plan.num_blocks == one.plan.num_blocks and two.plan.kv_bytes * 2 == one.plan.kv_bytes
        assert two.cache.k.shape[2] * 2 == one.cache.k.shape[2]                                           # its KV heads only
    finally: two.close()

def test_a_build_that_fails_after_loading_leaves_no_worker(tiny):
    before = children()
    with pytest.raises(ConfigError, match='fewer than one request'):
        Engine.build(tiny('llama_tied_gqa'), dtype='float32', tensor_parallel_size=2, num_kv_blocks=1, max_model_len=64)  # refused by the pool, after the load
    assert children() == before

@pytest.mark.parametrize('flags', [dict(batch_invariant=True), dict(prefix_cache=True, max_batch_size=2)])
def test_two_ranks_equal_one_in_other_modes(peaky, flags):
    "The batch-invariant path (it reads whole key blocks of the slot table), and shared prefix blocks with preemption (2 rows, 4 requests)."
    shared = list(range(30, 70))
    prompts = [shared + [1, 2], shared + [3], shared + [4, 5, 6], [9, 8, 7]]
    sp = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    kw = dict(dtype='float32', max_batch_size=4, num_kv_blocks=40) | flags
    want = tokens(Engine.build(peaky, **kw), prompts, sp)
    two = Engine.build(peaky, **kw, tensor_parallel_size=2)
    try: assert tokens(two, prompts, sp) == want
    finally: two.close()

def completions(url, prompts, **kw):
    client = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0)
    return [client.completions.create(model='tiny', prompt=p, **kw).choices[0].text for p in prompts]

def test_server_two_ranks_equals_one_process(peaky):
    flags = ('--dtype', 'float32', '--max-batch-size', '4', '--served-model-name', 'tiny')
    prompts = ['hello world', 'the capital of France is', [5, 6, 7, 8], 'abc xyz abc']
    with spawn_server(peaky, *flags) as (url, _):
        want = completions(url, prompts, max_tokens=24, temperature=0), completions(url, prompts, max_tokens=16, temperature=0.8, seed=3)
    with spawn_server(peaky, *flags, '--tensor-parallel-size', '2') as (url, _):
        tp = httpx.get(url + '/health').json()['tensor_parallel']
        assert (tp['size'], tp['backend'], tp['launched_by'], len(tp['worker_pids'])) == (2, 'gloo', 'nanoserve', 1)
        assert (completions(url, prompts, max_tokens=24, temperature=0), completions(url, prompts, max_tokens=16, temperature=0.8, seed=3)) == want

def test_server_default_model_three_ranks(default_model):
    "The default model split over 3 ranks answers a chat request with the tokens one process gives."
    q = [{'role': 'user', 'content': 'What is the capital of France?'}]
    want = Engine.build(default_model, dtype='float32', max_batch_size=2).generate([q], SamplingParams(max_tokens=24, temperature=0), use_tqdm=False)[0]
    with spawn_server(default_model, '--dtype', 'float32', '--max-batch-size', '2', '--tensor-parallel-size', '3', '--served-model-name', 'smol') as (url, _):
        assert httpx.get(url + '/health').json()['tensor_parallel']['size'] == 3
        r = openai.OpenAI(base_url=url + '/v1', api_key='none', max_retries=0).chat.completions.create(
            model='smol', messages=q, max_tokens=24, temperature=0, logprobs=True)
    assert r.choices[0].message.content == want.text and 'Paris' in want.text
    assert len(r.choices[0].logprobs.content) == len(want.token_ids)

def stream_until(url, at_third_event=None) -> list[dict]:
    """A streamed 400-token completion's events, calling `at_third_event` when the third arrives. A fast server may have written
    the whole stream before the client reads its third event: the caller checks which happened, never how long anything took."""
    body = {'model': 'tiny', 'prompt': 'hello', 'max_tokens': 400, 'ignore_eos': True, 'stream': True}
    events = []
    with httpx.stream('POST', url + '/v1/completions', json=body, timeout=120) as r:
        if r.status_code != 200: r.read(); return [r.json()]                # refused before streaming (a dead worker: 503 and its error)
        for line in r.iter_lines():
            if not line.startswith('data: ') or line == 'data: [DONE]': continue
            events.append(json.loads(line[6:]))
            if len(events) == 3 and at_third_event: at_third_event()
    return events

def dead_health(url, timeout=60.0) -> dict:
    "/health until it answers 503 (the watcher saw the worker go), bounded."
    import time
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = httpx.get(url + '/health', timeout=5)
        if r.status_code == 503: return r.json()
        time.sleep(0.1)
    raise AssertionError(f"/health still answers 200 {timeout} s after the worker was killed")

def test_worker_killed_mid_stream_fails_requests_and_health(peaky):
    "A worker killed while a stream runs: the stream ends with an error naming the rank, /health says 503 and why, new requests get 503; the server still stops."
    with spawn_server(peaky, '--dtype', 'float32', '--max-batch-size', '2', '--served-model-name', 'tiny', '--tensor-parallel-size', '2') as (url, _):
        pid = httpx.get(url + '/health').json()['tensor_parallel']['worker_pids'][0]
        events = stream_until(url, lambda: os.kill(pid, signal.SIGKILL))    # tokens are flowing: kill rank 1 now
        if 'error' not in events[-1]: events = stream_until(url)            # the whole stream was out before the kill: the next one meets it
        else: assert 3 <= len(events) - 1 < 400                             # it stopped early, with tokens before the error
        assert 'error' in events[-1] and 'worker rank 1' in events[-1]['error']['message'], events[-1]
        health = dead_health(url)
        assert health['status'] == 'dead' and 'killed by signal 9' in health['error']
        after = httpx.post(url + '/v1/completions', json={'model': 'tiny', 'prompt': 'hi', 'max_tokens': 4}, timeout=30)
        assert after.status_code == 503 and 'worker rank 1' in after.json()['error']['message']

def test_worker_killed_while_idle_turns_health_503(peaky):
    with spawn_server(peaky, '--dtype', 'float32', '--served-model-name', 'tiny', '--tensor-parallel-size', '2') as (url, _):
        assert completions(url, ['hello'], max_tokens=4, temperature=0)
        os.kill(httpx.get(url + '/health').json()['tensor_parallel']['worker_pids'][0], signal.SIGKILL)
        assert 'worker rank 1' in dead_health(url)['error']

def test_stuck_worker_fails_the_step_after_the_timeout(peaky):
    "A worker that is alive but stopped (SIGSTOP) cannot hang the server: the step fails after NANOSERVE_TP_STEP_TIMEOUT, /health turns 503."
    with spawn_server(peaky, '--dtype', 'float32', '--served-model-name', 'tiny', '--tensor-parallel-size', '2',
                      env={'NANOSERVE_TP_STEP_TIMEOUT': '15'}) as (url, _):
        pid = httpx.get(url + '/health').json()['tensor_parallel']['worker_pids'][0]
        try:
            events = stream_until(url, lambda: os.kill(pid, signal.SIGSTOP))
            if 'error' not in events[-1]: events = stream_until(url)        # the whole stream was out before the stop: the next one meets it
            assert 'error' in events[-1] and 'Timed out' in events[-1]['error']['message'], events[-1]
            assert 'timed out' in dead_health(url)['error'].lower()
        finally: os.kill(pid, signal.SIGCONT)

def test_offline_engine_names_the_dead_worker(peaky):
    engine = Engine.build(peaky, dtype='float32', tensor_parallel_size=2)
    try:
        engine.runner.tp.workers[0].kill(); engine.runner.tp.workers[0].wait(30)
        engine.runner.tp.died.wait(30)                                    # the watcher has seen it
        with pytest.raises(WorkerDied, match='worker rank 1 .* was killed by signal 9'):
            engine.generate(['hello'], SamplingParams(max_tokens=4), use_tqdm=False)
    finally: engine.close()

def test_torchrun_recipe_on_loopback(peaky):
    "The several-machines recipe, with both 'machines' on loopback: torchrun starts the ranks, `nanoserve generate` on each, rank 0 prints."
    args = ['generate', '--model', str(peaky), '--dtype', 'float32', '--json', '--max-tokens', '12', 'hello world', 'abc']
    torchrun = str(Path(sys.executable).parent/'torchrun')
    r = subprocess.run([torchrun, '--nnodes', '1', '--nproc-per-node', '2', '--master-addr', '127.0.0.1', '--master-port', str(free_port()),
                        '--no-python', NANOSERVE, *args, '--tensor-parallel-size', '2'], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    one = subprocess.run([NANOSERVE, *args], capture_output=True, text=True, timeout=300, check=True)
    got = [json.loads(l)['token_ids'] for l in r.stdout.splitlines() if l.startswith('{')]
    assert got == [json.loads(l)['token_ids'] for l in one.stdout.splitlines()] and len(got) == 2


def ranks_on_loopback(model, port: int, log, timeout: int = 8):
    """Rank 1 of a 2-rank split as a user on two machines starts it (`nanoserve serve` with RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT), both 'machines' on loopback, its output in the file `log`; rank 0 is started by the
    caller with the same variables (returned), RANK=0."""
    env = {'WORLD_SIZE': '2', 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': str(port), 'OMP_NUM_THREADS': '1'}
    args = ['--dtype', 'float32', '--served-model-name', 'tiny', '--tensor-parallel-size', '2',
            '--tensor-parallel-timeout', str(timeout)]
    worker = subprocess.Popen([NANOSERVE, 'serve', '--model', str(model), '--port', '0', *args],
                              env={**os.environ, **env, 'RANK': '1', 'LOCAL_RANK': '1'}, stdout=log,
                              stderr=subprocess.STDOUT, text=True)
    return worker, args, {**env, 'RANK': '0', 'LOCAL_RANK': '0'}

def test_heartbeat_sees_a_stopped_worker_while_idle(peaky, tmp_path):
    """Under a launcher rank 0 holds no handle on the worker's process: a worker stopped (SIGSTOP) while the server
    idles is seen by rank 0's heartbeat, which it does not take, and /health turns 503 naming it; no request has to
    fail first."""
    with open(tmp_path / 'worker.log', 'w+') as log:
        worker, args, env = ranks_on_loopback(peaky, free_port(), log)
        try:
            with spawn_server(peaky, *args, env=env) as (url, _):
                assert httpx.get(url + '/health').json()['tensor_parallel']['launched_by'] == 'torchrun'
                assert completions(url, ['hello'], max_tokens=4, temperature=0)
                worker.send_signal(signal.SIGSTOP)
                assert 'heartbeat' in dead_health(url, timeout=120)['error']
        finally:
            worker.kill()
            worker.wait(30)

def test_worker_exits_when_rank0_falls_silent(peaky, tmp_path):
    """A healthy server idles past three of its --tensor-parallel-timeout and its worker stays (the heartbeat keeps it);
    then rank 0 is stopped (SIGSTOP), its connections open: no reset reaches the worker, which hears no step and no
    heartbeat for the timeout and exits by itself, saying why, rather than waiting as long as a server idles."""
    with open(tmp_path / 'worker.log', 'w+') as log:
        worker, args, env = ranks_on_loopback(peaky, free_port(), log)
        port = free_port()
        rank0 = subprocess.Popen([NANOSERVE, 'serve', '--model', str(peaky), *args, '--port', str(port)],
                                 env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f'http://127.0.0.1:{port}'
            wait_healthy(url, rank0, 300, '/health', lambda: '')
            assert completions(url, ['hello'], max_tokens=4, temperature=0)
            with pytest.raises(subprocess.TimeoutExpired): worker.wait(3 * 8)       # idle, kept by the heartbeat
            assert completions(url, ['hello'], max_tokens=4, temperature=0)
            rank0.send_signal(signal.SIGSTOP)
            assert worker.wait(120) == 1
            log.seek(0)
            assert 'sent no step and no heartbeat' in log.read()
        finally:
            rank0.send_signal(signal.SIGCONT)
            rank0.kill()
            rank0.wait(30)
            worker.kill()
            worker.wait(30)
