"""Past one machine (issue 69): real test hosts made of network namespaces, each with its own address on a private
/24 joined by a bridge in a namespace of its own; a model split over two of them (started by torchrun, and by
nanoserve's own launcher with MASTER_ADDR), a crowd streamed to it through the OpenAI client from a third; what a client
sees when a host is killed or drops off the network; and two replicas on two hosts behind the project's HAProxy
configuration while one host's link is cut. Marked `hosts` (root and iproute2 needed; skipped with the reason
elsewhere). With NANOSERVE_FAULT_TABLE set to a CSV path they write the fault table there (`make fault-table`:
bench/results/hosts/faults.csv).

What the first run across namespaces taught (torch 2.13, c10d rendezvous): a torchrun node must be told its own address
(`--local-addr`), else torchrun hands the workers its hostname as MASTER_ADDR, which on a host whose name does not
resolve to the address the others reach (as here, where every namespace shares one hostname) sends rank 1 to its own
loopback; and the node serving the rendezvous must be told so (`--rdzv-conf is_host=1`) where its hostname does not
match the endpoint. Both are flags of torchrun, set the same way on real machines. gloo, left to itself, binds the
address the hostname resolves to; nanoserve binds the address that routes to MASTER_ADDR instead, so no
GLOO_SOCKET_IFNAME is needed (it still wins where it is set)."""
import csv, ctypes, json, os, re, shutil, subprocess, sys, tempfile, threading, time, uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
import httpx, openai, pytest
from nanoserve.loadgen import spawn_server

pytestmark = pytest.mark.hosts
NANOSERVE = str(Path(sys.executable).parent / 'nanoserve')
TORCHRUN = str(Path(sys.executable).parent / 'torchrun')
HAPROXY_CFG = Path(__file__).parent.parent / 'deploy' / 'haproxy.cfg'
README = Path(__file__).parent.parent / 'README.md'
PORT = 8000                    # every host has its own ports: each server listens on 8000 of its own
TIMEOUT = 10                   # --tensor-parallel-timeout in these tests (the default is 60 s)
BOUND = 90.0                   # seconds after a fault by which everything it ends must have ended: a hang fails here
FAULTS: list[dict] = []        # the fault table's rows, written at the end where NANOSERVE_FAULT_TABLE asks

def ip(*args, check=True):
    return subprocess.run(['ip', *args], capture_output=True, text=True, check=check)

def can_make_hosts() -> str | None:
    "Why this machine cannot make namespaces (None: it can)."
    if os.geteuid() != 0: return "making network namespaces needs root"
    if shutil.which('ip') is None: return "no iproute2 (apt install iproute2)"
    probe = f'nsprobe{uuid.uuid4().hex[:6]}'
    if ip('netns', 'add', probe, check=False).returncode: return "ip netns add is refused here"
    ip('netns', 'del', probe, check=False)
    return None

_libc = ctypes.CDLL(None, use_errno=True)

def enter(name: str):
    "Move the calling thread into namespace `name` (a network namespace is per thread): its sockets live there."
    fd = os.open(f'/var/run/netns/{name}', os.O_RDONLY)
    try:
        if _libc.setns(fd, 0x40000000):                          # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f'setns into {name}')
    finally: os.close(fd)

class Host:
    "One namespace on the test's bridge: its name, its address, the processes started in it."
    def __init__(self, name: str, addr: str):
        self.name, self.addr, self.procs = name, addr, []
    def __repr__(self): return f'Host({self.name}, {self.addr})'
    def start(self, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        "Run `cmd` in this host, its output in a file (`proc.output()` reads it)."
        log = tempfile.TemporaryFile('w+')
        p = subprocess.Popen(['ip', 'netns', 'exec', self.name, *cmd], stdout=log, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, 'OMP_NUM_THREADS': '1', **(env or {}),
                                  'PATH': f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
                             start_new_session=True)
        p.output, p.log = (lambda: (log.seek(0), log.read())[1]), log
        self.procs.append(p)
        return p
    def threads(self, n: int = 1) -> ThreadPoolExecutor:
        "Threads inside this host: a client there, or a probe of a server on its loopback."
        return ThreadPoolExecutor(n, initializer=enter, initargs=(self.name,))
    def call(self, fn, *args):
        with self.threads() as t: return t.submit(fn, *args).result()
    def link(self, up: bool): ip('-n', self.name, 'link', 'set', 'eth0', 'up' if up else 'down')
    def pids(self) -> list[int]: return [int(p) for p in ip('netns', 'pids', self.name, check=False).stdout.split()]
    def clear(self):
        "Kill whatever still runs here and bring the link back: the next test starts from a quiet host."
        for pid in self.pids():
            try: os.kill(pid, 9)
            except ProcessLookupError: pass
        for p in self.procs:
            p.wait(30)
            p.log.close()
        self.procs.clear()
        self.link(True)

@contextmanager
def hosts(n: int):
    """n namespaces, host i at 10.69.S.(i + 1)/24, joined by a bridge in a switch namespace; every process left in them
    killed and every namespace deleted after."""
    tag, subnet = uuid.uuid4().hex[:5], 100 + os.getpid() % 150
    sw, names = f'sw{tag}', [f'h{i}{tag}' for i in range(n)]
    made = []
    try:
        for name in [sw, *names]:
            ip('netns', 'add', name)
            made.append(name)
            ip('-n', name, 'link', 'set', 'lo', 'up')
        ip('-n', sw, 'link', 'add', 'br0', 'type', 'bridge')
        ip('-n', sw, 'link', 'set', 'br0', 'up')
        out = []
        for i, name in enumerate(names):
            ip('link', 'add', f'e{i}{tag}', 'type', 'veth', 'peer', 'name', f'p{i}{tag}')
            ip('link', 'set', f'e{i}{tag}', 'netns', name)
            ip('link', 'set', f'p{i}{tag}', 'netns', sw)
            ip('-n', name, 'link', 'set', f'e{i}{tag}', 'name', 'eth0')
            out.append(Host(name, f'10.69.{subnet}.{i + 1}'))
            ip('-n', name, 'addr', 'add', f'{out[-1].addr}/24', 'dev', 'eth0')
            ip('-n', name, 'link', 'set', 'eth0', 'up')
            ip('-n', sw, 'link', 'set', f'p{i}{tag}', 'master', 'br0')
            ip('-n', sw, 'link', 'set', f'p{i}{tag}', 'up')
        yield out
    finally:
        for i in range(n): ip('link', 'del', f'e{i}{tag}', check=False)      # a cable not yet moved into its host
        for name in made:
            for pid in ip('netns', 'pids', name, check=False).stdout.split():
                try: os.kill(int(pid), 9)
                except ProcessLookupError: pass
            ip('netns', 'del', name, check=False)
        left = set(ip('netns', 'list').stdout.split()) & set(made)
        assert not left, f"namespaces left behind: {left}"

@pytest.fixture(scope='module')
def three_hosts():
    if why := can_make_hosts(): pytest.skip(why)
    with hosts(3) as h:
        yield h
    if path := os.environ.get('NANOSERVE_FAULT_TABLE'):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, 'w', newline='') as f:
            w = csv.DictWriter(f, ['case', 'client_saw', 'seconds_to_detect', 'requests_lost', 'in_flight', 'worker'])
            w.writeheader()
            w.writerows(FAULTS)
        Path(path).with_suffix('.machine.txt').write_text(machine())

def machine() -> str:
    "What the fault table was measured on: the CPU (model and flags), its threads, torch, HAProxy, the command."
    import platform, torch
    info = dict(l.split(':', 1) for l in open('/proc/cpuinfo').read().split('\n\n')[0].splitlines() if ':' in l)
    info = {k.strip(): v.strip() for k, v in info.items()}
    cpu = f"{info.get('model name', '?')} family {info.get('cpu family', '?')} model {info.get('model', '?')}"
    flags = next((l.split(':', 1)[1].split() for l in open('/proc/cpuinfo') if l.startswith('flags')), [])
    isa = ' '.join(f for f in flags if f in ('avx2', 'avx512f', 'avx512_bf16', 'amx_tile', 'amx_bf16', 'amx_int8'))
    hap = subprocess.run(['haproxy', '-v'], capture_output=True, text=True).stdout.split('\n')[0] \
        if shutil.which('haproxy') else 'no haproxy'
    return (f"cpu: {cpu} ({isa}), {os.cpu_count()} threads, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}\n"
            f"torch {torch.__version__}, python {platform.python_version()}, {hap}\n"
            f"--tensor-parallel-timeout {TIMEOUT} in the split's cases; command: make fault-table\n")

@pytest.fixture
def net(three_hosts):
    "The three hosts, quiet before and after each test."
    yield three_hosts
    for h in three_hosts: h.clear()

def health(url: str) -> httpx.Response: return httpx.get(url + '/health', timeout=5)

def wait_healthy(probe: Host, url: str, procs: list, timeout: float = 300.0):
    "Poll `url`/health from inside `probe` until it answers 200; fail with the servers' output if one of them exits."
    def poll():
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if dead := [p for p in procs if p.poll() is not None]:
                raise AssertionError(f"a server exited ({dead[0].returncode}):\n{dead[0].output()[-3000:]}")
            try:
                if health(url).status_code == 200: return
            except httpx.HTTPError: pass
            time.sleep(0.1)
        raise AssertionError(f"{url} not healthy in {timeout} s:\n" + '\n'.join(p.output()[-2000:] for p in procs))
    probe.call(poll)

def until(probe: Host | None, cond, what: str, timeout: float = BOUND) -> float:
    """Poll `cond()` from inside `probe` (None: from here, the root namespace) until it holds; the seconds it took, or
    fail saying `what` did not happen."""
    def poll():
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if cond(): return time.monotonic() - t0
            time.sleep(0.05)
        raise AssertionError(f"{what} within {timeout} s")
    return poll() if probe is None else probe.call(poll)

SERVE = ('--dtype', 'float32', '--served-model-name', 'tiny', '--max-batch-size', '8', '--host', '0.0.0.0',
         '--port', str(PORT))

def serve(host: Host, model, *flags, env=None) -> subprocess.Popen:
    return host.start([NANOSERVE, 'serve', '--model', str(model), *SERVE, *flags], env)

def split_server(rank0: Host, rank1: Host, model, *flags) -> list[subprocess.Popen]:
    """A model split over two hosts by nanoserve's own launcher: the same `nanoserve serve` on each, told its rank and
    rank 0's address as torchrun would tell it."""
    env = {'WORLD_SIZE': '2', 'MASTER_ADDR': rank0.addr, 'MASTER_PORT': '29400'}
    return [serve(h, model, '--tensor-parallel-size', '2', '--tensor-parallel-timeout', str(TIMEOUT), *flags,
                  env={**env, 'RANK': str(r), 'LOCAL_RANK': '0'}) for r, h in enumerate((rank0, rank1))]

class Stream:
    "One streamed completion as a client sees it: the text and logprobs it got, how it ended, and when."
    def __init__(self, url: str, prompt: str, max_tokens: int):
        self.url, self.prompt, self.max_tokens = url, prompt, max_tokens
        self.text, self.logprobs, self.error, self.ended, self.finish = '', [], None, None, None
        self.chunks, self.started = 0, False
    def run(self, started: threading.Semaphore | None = None):
        try:
            # a stream that hangs past the bound ends here, in an APITimeoutError: the tests fail on it
            client = openai.OpenAI(base_url=self.url + '/v1', api_key='none', max_retries=0, timeout=BOUND)
            answer = client.completions.create(model='tiny', prompt=self.prompt, max_tokens=self.max_tokens,
                                               temperature=0, logprobs=1, stream=True, extra_body={'ignore_eos': True})
            self.started = True                                  # its response began: a server took it
            for chunk in answer:
                for c in chunk.choices:
                    self.text += c.text
                    self.logprobs += c.logprobs.token_logprobs if c.logprobs else []
                    self.finish = c.finish_reason or self.finish
                self.chunks += 1
                if self.chunks == 3 and started is not None: started.release()
        except Exception as e: self.error = f'{type(e).__name__}: {e}'
        finally:
            self.ended = time.monotonic()
            if self.chunks < 3 and started is not None: started.release()
        return self

def crowd(client: Host | None, url: str, prompts: list[str], max_tokens: int,
          fault=None) -> tuple[list[Stream], float | None]:
    """Stream `prompts` at once from inside `client` (None: from the root namespace); once every stream has had three
    chunks, call `fault()` (from the test's own thread, in the root namespace) and note when."""
    started, streams = threading.Semaphore(0), [Stream(url, p, max_tokens) for p in prompts]
    with client.threads(len(prompts)) if client else ThreadPoolExecutor(len(prompts)) as t:
        futs = [t.submit(s.run, started) for s in streams]
        for _ in prompts: assert started.acquire(timeout=BOUND), "the crowd did not start"
        at = None
        if fault is not None:
            at = time.monotonic()
            fault()
        for f in futs: f.result(timeout=BOUND + 60)
    return streams, at

PROMPTS = ['hello world', 'the capital of France is', 'abc xyz abc', 'one two three', 'a b c d', 'the quick brown fox',
           'numbers: 1 2 3', 'zzz']

@pytest.fixture(scope='module')
def one_process(peaky, three_hosts):
    "The crowd's answers from one process on this machine's loopback: what every split below must give."
    with spawn_server(peaky, '--dtype', 'float32', '--served-model-name', 'tiny', '--max-batch-size', '8') as (url, _):
        return crowd(None, url, PROMPTS, 48)[0]

def split_answers_equal(h0: Host, h2: Host, procs: list, one_process: list[Stream]):
    "A crowd of 8 streams from h2 to the split server on h0 gets one process's texts, and its logprobs to rounding."
    wait_healthy(h2, f'http://{h0.addr}:{PORT}', procs)
    assert h2.call(lambda: health(f'http://{h0.addr}:{PORT}').json()['tensor_parallel']['size']) == 2
    split, _ = crowd(h2, f'http://{h0.addr}:{PORT}', PROMPTS, 48)
    assert [s.error for s in split] == [None] * 8 and [s.finish for s in split] == ['length'] * 8
    assert [s.text for s in split] == [s.text for s in one_process]
    assert_logprobs_close([s.logprobs for s in split], [s.logprobs for s in one_process])

# -- a model split over two hosts ---------------------------------------------------------------------------------

def test_tensor_parallel_across_two_hosts_equals_one_process(peaky, net, tmp_path):
    """Rank 0 on one host and rank 1 on another, each started by `torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend
    c10d` with `nanoserve generate --tensor-parallel-size 2`: rank 0's greedy tokens are one process's, token for token,
    and its logprobs too. The ranks share no loopback: their gloo traffic crosses the hosts' link."""
    (prompts := tmp_path / 'prompts.jsonl').write_text('\n'.join(json.dumps({'prompt': p, 'logprobs': 2})
                                                                 for p in ('hello world', 'abc')))
    args = ['generate', '--model', str(peaky), '--dtype', 'float32', '--json', '--max-tokens', '12', '--prompts-file',
            str(prompts), '--tensor-parallel-size', '2']
    h0 = net[0]
    endpoint = f'{h0.addr}:29{os.getpid() % 400 + 100}'
    procs = [h.start([TORCHRUN, '--nnodes', '2', '--nproc-per-node', '1', '--rdzv-backend', 'c10d', '--rdzv-endpoint',
                      endpoint, '--rdzv-conf', f'is_host={int(rank == 0)},join_timeout=120', '--local-addr', h.addr,
                      '--no-python', NANOSERVE, *args]) for rank, h in enumerate(net[:2])]
    for p in procs: p.wait(180)
    assert [p.returncode for p in procs] == [0, 0], procs[0].output()[-2000:] + procs[1].output()[-2000:]
    one = subprocess.run([NANOSERVE, *args[:-2]], capture_output=True, text=True, timeout=300, check=True)
    split = [json.loads(line) for line in procs[0].output().splitlines() if line.startswith('{')]
    whole = [json.loads(line) for line in one.stdout.splitlines()]
    assert [r['token_ids'] for r in split] == [r['token_ids'] for r in whole] and len(split) == 2
    assert_logprobs_close([r['logprobs'] for r in split], [r['logprobs'] for r in whole])
    assert not [line for line in procs[1].output().splitlines() if line.startswith('{')]   # rank 1 prints no answers

def assert_logprobs_close(got, want, tol: float = 1e-4):
    """The same logprobs, to float32 rounding: the split sums each product in two halves across the ranks, one process
    in one pass, so the last bits may differ (what they do differ by is printed for the build log)."""
    def walk(g, w):
        if isinstance(g, (list, tuple)):
            assert len(g) == len(w)
            return [d for a, b in zip(g, w) for d in walk(a, b)]
        if isinstance(g, dict):
            assert g.keys() == w.keys(), (g, w)
            return walk(list(g.values()), list(w.values()))
        return [abs(g - w)]
    diffs = walk(got, want)
    print(f"logprobs compared: {len(diffs)}; largest difference {max(diffs):.3g}; exactly equal {diffs.count(0.0)}")
    assert max(diffs) <= tol

def test_split_server_across_hosts_serves_a_crowd_from_a_third(peaky, net, one_process):
    """`nanoserve serve` split over two hosts by its own launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), a crowd
    of 8 streams sent through the OpenAI client from a third host: every answer is one process's, token for token (the
    texts) and logprob for logprob (to float32 rounding)."""
    h0, h1, h2 = net
    procs = split_server(h0, h1, peaky)
    split_answers_equal(h0, h2, procs, one_process)
    info = h2.call(lambda: health(f'http://{h0.addr}:{PORT}').json()['tensor_parallel'])
    assert info['launched_by'] == 'torchrun'                  # rank 0 started no process of its own
    procs[0].send_signal(2)                                   # Ctrl-C on rank 0: it tells rank 1 to stop, and both exit
    procs[0].wait(60)
    assert procs[1].wait(60) == 0, procs[1].output()[-2000:]

def readme_two_host_commands() -> list[str]:
    "The README's deployment commands, rank 0's then rank 1's, each joined onto one line."
    block = next(b for b in re.findall(r'^```bash\n(.*?)^```$', README.read_text(), re.M | re.S)
                 if b.startswith('# two machines:'))
    return [' '.join(c.replace('\\\n', ' ').split()) for c in re.findall(r'^torchrun .*?(?<!\\)$', block, re.M | re.S)]

def test_the_readme_two_machine_commands_serve_a_crowd_from_a_third_host(peaky, net, one_process):
    """The README's two torchrun commands, as written but for the addresses (rank 0's host, rank 1's) and MODEL, run on
    two hosts; a crowd of 8 streams from a third gets one process's answers (the same texts, logprobs to float32
    rounding)."""
    h0, h1, h2 = net
    flags = ['--dtype', 'float32', '--served-model-name', 'tiny', '--max-batch-size', '8']
    procs = []
    for cmd in readme_two_host_commands():
        cmd = cmd.replace('10.0.0.1', h0.addr).replace('10.0.0.2', h1.addr).replace('MODEL', str(peaky))
        procs.append((h0 if f'--local-addr {h0.addr}' in cmd else h1).start(cmd.split() + flags))
    split_answers_equal(h0, h2, procs, one_process)

# -- a host lost -------------------------------------------------------------------------------------------------------

def lost_mid_stream(net, peaky, case: str, fault) -> dict:
    """A split server on h0 and h1, 8 streams from h2, `fault(h0, h1)` once they flow: every stream ends (an error
    event, or finished before the fault reached it) within the bound, /health says 503 and why, nothing hangs."""
    h0, h1, h2 = net
    url = f'http://{h0.addr}:{PORT}'
    procs = split_server(h0, h1, peaky)
    wait_healthy(h2, url, procs)
    streams, at = crowd(h2, url, PROMPTS, 400, lambda: fault(h0, h1))
    lost = [s for s in streams if s.error]
    assert lost, "no stream met the fault: all 8 finished before it"
    assert all(s.error and 'tensor-parallel' in s.error for s in lost), [s.error for s in lost]
    assert all(s.finish == 'length' and len(s.logprobs) == 400 for s in streams if not s.error)
    detect = max(s.ended for s in lost) - at
    body = h2.call(lambda: health(url))
    assert body.status_code == 503 and 'tensor-parallel' in body.json()['error'], body.text
    after = h2.call(lambda: httpx.post(url + '/v1/completions', json={'model': 'tiny', 'prompt': 'hi', 'max_tokens': 4},
                                       timeout=30))
    assert after.status_code == 503
    return {'case': case, 'client_saw': said(lost[0].error), 'seconds_to_detect': round(detect, 2),
            'requests_lost': len(lost), 'in_flight': len(streams), 'at': at}

def said(message: str) -> str:
    "A message for the fault table: without gloo's source paths and the prefixes every layer adds."
    message = re.sub(r'\[/\S+\] ', '', message)
    for prefix in ('the engine failed during the request: ', 'the engine loop failed: ', 'nanoserve worker rank 1: '):
        message = message.replace(prefix, '')
    return message

def worker_exits(h1: Host, at: float) -> str:
    "Wait until the worker's host runs nothing (it exited by itself); how long after the fault that was."
    # asked from the root namespace: an `ip` run inside h1 would count itself
    until(None, lambda: not h1.pids(), f"the worker on {h1.name} did not exit by itself")
    assert [p.wait(30) for p in h1.procs] == [1], h1.procs[0].output()[-2000:]
    last = h1.procs[0].output().strip().splitlines()[-1]
    return f"exited by itself after {time.monotonic() - at:.1f} s: {said(last)}"

def test_rank1_killed_mid_stream(peaky, net):
    "Rank 1's process killed (SIGKILL) while 8 streams run: rank 0's gloo reads the reset at once."
    row = lost_mid_stream(net, peaky, 'rank 1 killed (SIGKILL) mid-stream',
                          lambda h0, h1: [os.kill(pid, 9) for pid in h1.pids()])
    row.pop('at')
    FAULTS.append({**row, 'worker': 'killed'})

def test_rank1_link_down_mid_stream(peaky, net):
    """Rank 1's host drops off the network (`ip link set eth0 down`) while 8 streams run: no reset arrives, so rank 0's
    sums fail after --tensor-parallel-timeout; rank 1, hearing nothing from rank 0, exits by itself."""
    row = lost_mid_stream(net, peaky, "rank 1's link down mid-stream", lambda h0, h1: h1.link(False))
    worker = worker_exits(net[1], row.pop('at'))
    FAULTS.append({**row, 'worker': worker})

def test_rank0_cut_off_while_idle(peaky, net):
    """Rank 0's host drops off the network while the server idles: rank 0's heartbeat goes untaken (/health, asked on
    rank 0's own loopback, turns 503) and the worker, hearing no step and no heartbeat, exits by itself."""
    h0, h1, h2 = net
    procs = split_server(h0, h1, peaky)
    wait_healthy(h2, f'http://{h0.addr}:{PORT}', procs)
    streams, _ = crowd(h2, f'http://{h0.addr}:{PORT}', PROMPTS[:2], 8)
    assert [s.error for s in streams] == [None, None]
    at = time.monotonic()
    h0.link(False)
    local = f'http://127.0.0.1:{PORT}'
    detect = until(h0, lambda: health(local).status_code == 503, "rank 0's /health did not turn 503")
    assert 'heartbeat' in h0.call(lambda: health(local).json()['error'])
    worker = worker_exits(h1, at)
    assert procs[0].poll() is None                       # rank 0 stays up, answering 503 until it is restarted
    FAULTS.append({'case': "rank 0's link down, idle", 'client_saw': '/health 503: ' +
                   said(h0.call(lambda: health(local).json()['error'])), 'seconds_to_detect': round(detect, 2),
                   'requests_lost': 0, 'in_flight': 0, 'worker': worker})

# -- replicas on two hosts behind HAProxy ------------------------------------------------------------------------------

def test_replicas_on_two_hosts_behind_haproxy(peaky, tiny, net):
    """Replica a on h0, replica b on h1 (a model of other weights, so that every answer names its replica), HAProxy and
    the client on h2 with deploy/haproxy.cfg unchanged but for the addresses. Requests alternate; b's link is cut
    during a crowd of 64 streamed requests; HAProxy marks b down through /health and cuts its open streams; every
    request that had not started on b is answered by a; the failures are at most the requests in flight on b."""
    if shutil.which('haproxy') is None: pytest.skip('haproxy is not installed (make lb installs it)')
    h0, h1, h2 = net
    other = tiny('llama_tied_gqa')
    servers = [serve(h0, peaky), serve(h1, other)]
    wait_healthy(h2, f'http://{h0.addr}:{PORT}', servers[:1])
    wait_healthy(h2, f'http://{h1.addr}:{PORT}', servers[1:])
    env = {'LISTEN': '127.0.0.1:8080', 'STATS': '127.0.0.1:8404', 'REPLICA_A': f'{h0.addr}:{PORT}',
           'REPLICA_B': f'{h1.addr}:{PORT}'}
    proxy = h2.start(['haproxy', '-db', '-f', str(HAPROXY_CFG)], env)
    lb, b_local = 'http://127.0.0.1:8080', f'http://127.0.0.1:{PORT}'

    def states() -> dict:
        rows = csv.DictReader(httpx.get('http://127.0.0.1:8404/stats;csv', timeout=5).text.lstrip('# ').splitlines())
        return {r['svname']: r['status'].split()[0] for r in rows if r['svname'] in ('a', 'b')}
    def up():
        try: return states() == {'a': 'UP', 'b': 'UP'}
        except httpx.HTTPError: return False
    until(h2, up, 'HAProxy did not see both replicas healthy')
    first = [h2.call(Stream(lb, 'hello world', 120).run) for _ in range(4)]
    assert [s.error for s in first] == [None] * 4, first[0].error
    answers = {s.text for s in first}
    assert len(answers) == 2                                         # round robin: both replicas answered, two models
    a_text = h2.call(Stream(f'http://{h0.addr}:{PORT}', 'hello world', 120).run).text
    b_text = (answers - {a_text}).pop()

    streams, done_before, cut = [Stream(lb, 'hello world', 120) for _ in range(64)], [], threading.Event()
    def one(s: Stream):
        s.run()
        if not cut.is_set() and not s.error: done_before.append(s)
    with h2.threads(16) as t:
        futs = [t.submit(one, s) for s in streams]
        until(h2, lambda: len(done_before) >= 16, 'the crowd did not get going')
        cut.set()
        at = time.monotonic()
        h1.link(False)
        down = until(h2, lambda: states()['b'] == 'DOWN', 'HAProxy did not mark the cut replica down')
        for f in futs: f.result(timeout=BOUND + 60)
    # b, still up behind its cut link, counts what reached it: asked on its own loopback
    b_admitted = h1.call(lambda: health(b_local).json()['stats']['num_requests']) - 2   # less the two before the crowd
    b_done_before = sum(s.text == b_text for s in done_before)
    in_flight_b = b_admitted - b_done_before
    failed = [s for s in streams if s.error or s.finish != 'length']
    assert not [s for s in failed if 'Timeout' in (s.error or '')]    # none hung: the lost ones ended, cut
    print(f"64 streamed requests, b cut after {len(done_before)} had finished: {len(failed)} failed, {in_flight_b} "
          f"were in flight on b; HAProxy marked b down {down:.1f} s after the cut")
    assert in_flight_b > 0                                           # the cut met streams on b
    assert len(failed) <= in_flight_b, [(s.error, s.started, s.finish, s.text == a_text, b_text.startswith(s.text),
                                         len(s.text)) for s in failed]
    assert all(b_text.startswith(s.text) for s in failed)           # only streams on b failed
    assert all(s.text in (a_text, b_text) for s in streams if s not in failed)
    ended = max(s.ended for s in streams) - at
    assert proxy.poll() is None
    FAULTS.append({'case': "replica b's link down, 64 streams behind HAProxy",
                   'client_saw': f"{len(failed)} streams cut when HAProxy marked b down; the rest answered by a",
                   'seconds_to_detect': round(down, 2), 'requests_lost': len(failed), 'in_flight': in_flight_b,
                   'worker': f'(no split) last stream ended {ended:.1f} s after the cut'})
