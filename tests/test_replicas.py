"""Scaling past one machine's cores by replicas: two `nanoserve serve` processes behind HAProxy (deploy/haproxy.cfg, run unchanged on
loopback), /health deciding which replica gets traffic. One replica is split over 2 ranks; killing its worker turns its /health to 503,
HAProxy takes it out, and every request still gets an answer from the other. `make lb` installs haproxy (as `make browser` installs chromium)."""
import csv, io, os, shutil, signal, subprocess, time
from pathlib import Path
import httpx, openai, pytest
from nanoserve.loadgen import spawn_server, free_port

CONFIG = Path(__file__).parent.parent/'deploy'/'haproxy.cfg'
pytestmark = pytest.mark.skipif(shutil.which('haproxy') is None, reason='haproxy is not installed (make lb installs it where apt-get runs as root)')

def states(stats: str) -> dict[str, str]:
    "Server name -> HAProxy's status of it (UP, DOWN, ...), from the stats page's CSV."
    rows = csv.DictReader(io.StringIO(httpx.get(f'http://{stats}/stats;csv', timeout=5).text.lstrip('# ')))
    return {r['svname']: r['status'].split()[0] for r in rows if r['pxname'] == 'nanoserve' and r['svname'] in ('a', 'b')}

def until(cond, what: str, timeout: float = 60.0):
    "Poll `cond` (HAProxy's own view) until it holds, or fail saying `what` did not happen."
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond(): return
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout} s")

def served(url: str) -> int: return httpx.get(url + '/health', timeout=5).json()['stats']['num_requests']

def test_two_replicas_behind_haproxy_health_driven(peaky):
    flags = ('--dtype', 'float32', '--max-batch-size', '2', '--served-model-name', 'tiny')
    with spawn_server(peaky, *flags, '--tensor-parallel-size', '2') as (a, _), spawn_server(peaky, *flags) as (b, _):
        lb, stats = f'127.0.0.1:{free_port()}', f'127.0.0.1:{free_port()}'
        env = {**os.environ, 'LISTEN': lb, 'STATS': stats, 'REPLICA_A': a.removeprefix('http://'), 'REPLICA_B': b.removeprefix('http://')}
        proxy = subprocess.Popen(['haproxy', '-db', '-f', str(CONFIG)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            def up():
                try: return states(stats) == {'a': 'UP', 'b': 'UP'}
                except httpx.HTTPError: return False
            until(up, 'HAProxy did not see both replicas healthy')
            client = openai.OpenAI(base_url=f'http://{lb}/v1', api_key='none', max_retries=0)
            ask = lambda: client.completions.create(model='tiny', prompt='hello world', max_tokens=6, temperature=0).choices[0].text
            first = {ask() for _ in range(6)}
            assert len(first) == 1 and served(a) == served(b) == 3                      # round robin over both, the same answer from each
            os.kill(httpx.get(a + '/health').json()['tensor_parallel']['worker_pids'][0], signal.SIGKILL)
            until(lambda: states(stats)['a'] == 'DOWN', 'HAProxy did not take the replica with a dead worker out')
            assert httpx.get(a + '/health').status_code == 503
            assert {ask() for _ in range(6)} == first and served(b) == 9                 # every request answered, all by the healthy one
        finally:
            proxy.terminate(); proxy.wait(30)
