"""Fuzzing: schemathesis generates requests from the server's OpenAPI schema (built from its routes alone, no engine) and sends them
to a real `nanoserve serve` on 127.0.0.1, started for this module and stopped after it; no response may be a 500, none may hang."""
import httpx, pytest, schemathesis
from hypothesis import settings, HealthCheck
from nanoserve.loadgen import spawn_server
from nanoserve.adapters import api_schema
from conftest import make_tiny

schema = schemathesis.openapi.from_dict(api_schema())

@pytest.fixture(scope='module')
def server(tmp_path_factory):
    path = make_tiny(tmp_path_factory.mktemp('fuzz'), 'llama_tied_gqa')
    with spawn_server(path, '--served-model-name', 'tiny', '--max-model-len', '64', '--max-batch-size', '4', '--max-tokens-default', '4',
                      '--dtype', 'float32') as (url, _):
        yield url

@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_500_and_no_hang(case, server):
    if case.body is not None and isinstance(case.body, dict) and isinstance(case.body.get('max_tokens'), int):
        case.body['max_tokens'] = min(case.body['max_tokens'], 8)      # keep each example short; huge values are tested by hand
    response = case.call(base_url=server, timeout=30)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
    ctype = response.headers.get('content-type') or ''
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    if response.status_code >= 400 and ctype.startswith('application/json'):
        assert set(response.json()['error']) == {'message', 'type', 'param', 'code'}

def test_engine_still_healthy_after_fuzzing(server):
    s = httpx.get(server + '/health').json()
    assert s['status'] == 'ok' and (s['stats']['num_running'], s['stats']['num_waiting']) == (0, 0)
    assert s['stats']['kv_free_blocks'] == s['stats']['kv_total_blocks']
