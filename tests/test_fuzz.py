"""Fuzzing: schemathesis generates requests from the server's OpenAPI schema (built from its routes alone, no engine) and sends them
to a real `nanoserve serve` on 127.0.0.1, started for this module and stopped after it; no response may be a 500, none may hang."""
import httpx, pytest, schemathesis
from hypothesis import settings, HealthCheck
from nanoserve.loadgen import spawn_server
from nanoserve.adapters import api_schema
from conftest import make_tiny, make_embedder

schema = schemathesis.openapi.from_dict(api_schema())
embeddings = schema.include(path='/v1/embeddings')
ADAPTED = {'/v1/embeddings', '/v1/responses', '/v1/messages'}     # fuzzed past the model check: their bodies name the served one

@pytest.fixture(scope='module')
def server(tmp_path_factory):
    path = make_tiny(tmp_path_factory.mktemp('fuzz'), 'llama_tied_gqa')
    with spawn_server(path, '--served-model-name', 'tiny', '--max-model-len', '64', '--max-batch-size', '4', '--max-tokens-default', '4',
                      '--dtype', 'float32') as (url, _):
        yield url

@pytest.fixture(scope='module')
def pooling_server(tmp_path_factory):
    path = make_embedder(tmp_path_factory.mktemp('fuzz_embed'))
    with spawn_server(path, '--runner', 'pooling', '--served-model-name', 'tiny', '--max-model-len', '64', '--max-batch-size', '4',
                      '--dtype', 'float32') as (url, _):
        yield url

def check(case, url):
    "No 500, no hang; an error in its route's shape (Anthropic's on /v1/messages, OpenAI's elsewhere)."
    body = case.body if isinstance(case.body, dict) else None
    for k in ('max_tokens', 'max_output_tokens'):
        if body is not None and isinstance(body.get(k), int):
            body[k] = min(body[k], 8)      # keep each example short; huge values are tested by hand
    if body is not None and case.path in ADAPTED and isinstance(body.get('model'), str): body['model'] = 'tiny'
    response = case.call(base_url=url, timeout=30)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
    ctype = response.headers.get('content-type') or ''
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    if response.status_code >= 400 and ctype.startswith('application/json'):
        if case.path == '/v1/messages' and response.status_code != 401:
            assert response.json()['type'] == 'error' and set(response.json()['error']) == {'type', 'message'}
        else: assert set(response.json()['error']) == {'message', 'type', 'param', 'code'}

@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_500_and_no_hang(case, server): check(case, server)

@embeddings.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_embeddings_no_500_and_no_hang(case, pooling_server): check(case, pooling_server)

@pytest.mark.parametrize('which', ['server', 'pooling_server'])
def test_engine_still_healthy_after_fuzzing(which, request):
    s = httpx.get(request.getfixturevalue(which) + '/health').json()
    assert s['status'] == 'ok' and (s['stats']['num_running'], s['stats']['num_waiting']) == (0, 0)
    assert s['stats']['kv_free_blocks'] == s['stats']['kv_total_blocks']
