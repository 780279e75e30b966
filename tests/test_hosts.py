"""Past one machine (issue 69, begun): real test hosts made of network namespaces, each with its own address on a private
/24 joined by a bridge in a namespace of its own, and tensor parallelism across two of them started by torchrun as a user
on two machines would start it. Marked `hosts` (root and iproute2 needed; run by `make hosts`, not yet in `make test`).

What the first run across namespaces taught (torch 2.13, c10d rendezvous): a node must be told its own address
(`--local-addr`), else torchrun hands the workers its hostname as MASTER_ADDR, which on a host whose name does not
resolve to the address the others reach (as here, where every namespace shares one hostname) sends rank 1 to its own
loopback; and the node serving the rendezvous must be told so (`--rdzv-conf is_host=1`) where its hostname does not
match the endpoint. Both are flags of torchrun, set the same way on real machines. And gloo binds the address the
hostname resolves to unless `GLOO_SOCKET_IFNAME` names the interface that reaches the other host."""
import json, os, shutil, subprocess, sys, uuid
from contextlib import contextmanager
from pathlib import Path
import pytest

pytestmark = pytest.mark.hosts
NANOSERVE = str(Path(sys.executable).parent / 'nanoserve')
TORCHRUN = str(Path(sys.executable).parent / 'torchrun')

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
        addrs = []
        for i, name in enumerate(names):
            ip('link', 'add', f'e{i}{tag}', 'type', 'veth', 'peer', 'name', f'p{i}{tag}')
            ip('link', 'set', f'e{i}{tag}', 'netns', name)
            ip('link', 'set', f'p{i}{tag}', 'netns', sw)
            ip('-n', name, 'link', 'set', f'e{i}{tag}', 'name', 'eth0')
            addrs.append(f'10.69.{subnet}.{i + 1}')
            ip('-n', name, 'addr', 'add', f'{addrs[-1]}/24', 'dev', 'eth0')
            ip('-n', name, 'link', 'set', 'eth0', 'up')
            ip('-n', sw, 'link', 'set', f'p{i}{tag}', 'master', 'br0')
            ip('-n', sw, 'link', 'set', f'p{i}{tag}', 'up')
        yield list(zip(names, addrs))
    finally:
        for name in made:
            for pid in ip('netns', 'pids', name, check=False).stdout.split():
                try: os.kill(int(pid), 9)
                except ProcessLookupError: pass
            ip('netns', 'del', name, check=False)

@pytest.fixture(scope='module')
def two_hosts():
    if why := can_make_hosts(): pytest.skip(why)
    with hosts(2) as h: yield h

def test_tensor_parallel_across_two_hosts_equals_one_process(peaky, two_hosts):
    """Rank 0 on one host and rank 1 on another, each started by `torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend
    c10d` with `nanoserve generate --tensor-parallel-size 2`; rank 0's greedy tokens are one process's, token for
    token. The ranks share no loopback: their gloo traffic crosses the hosts' link."""
    args = ['generate', '--model', str(peaky), '--dtype', 'float32', '--json', '--max-tokens', '12', 'hello world', 'abc',
            '--tensor-parallel-size', '2']
    (h0, a0), (h1, a1) = two_hosts
    endpoint = f'{a0}:29{os.getpid() % 400 + 100}'
    procs = []
    for rank, (name, addr) in enumerate(two_hosts):
        cmd = ['ip', 'netns', 'exec', name, TORCHRUN, '--nnodes', '2', '--nproc-per-node', '1', '--rdzv-backend', 'c10d',
               '--rdzv-endpoint', endpoint, '--rdzv-conf', f'is_host={int(rank == 0)},join_timeout=120',
               '--local-addr', addr, '--no-python', NANOSERVE, *args]
        # gloo binds the address its hostname resolves to unless told the interface: on real machines too
        env = {**os.environ, 'GLOO_SOCKET_IFNAME': 'eth0'}
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=150) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    one = subprocess.run([NANOSERVE, *args[:-2]], capture_output=True, text=True, timeout=300, check=True)
    split = [json.loads(l)['token_ids'] for l in outs[0][0].splitlines() if l.startswith('{')]
    assert split == [json.loads(l)['token_ids'] for l in one.stdout.splitlines()] and len(split) == 2
    assert not outs[1][0].strip()                                   # rank 1 serves its shard and prints nothing
