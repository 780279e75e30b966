"Fuzzing: schemathesis generates requests from the server's own OpenAPI schema; no response may be a 500, none may hang."
import pytest, schemathesis
from hypothesis import settings, HealthCheck
from nanoserve.launch import build_app
from conftest import make_tiny

_state = {}

def _app(tmp_path_factory=None):
    if 'app' not in _state:
        import tempfile, pathlib
        path = make_tiny(pathlib.Path(tempfile.mkdtemp()), 'llama_tied_gqa')
        _state['app'], _state['aeng'] = build_app(str(path), served_model_name='tiny', max_model_len=64, max_batch_size=4,
                                                  max_tokens_default=4)
    return _state['app']

schema = schemathesis.openapi.from_asgi('/openapi.json', _app())

@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_500_and_no_hang(case):
    if case.body is not None and isinstance(case.body, dict) and isinstance(case.body.get('max_tokens'), int):
        case.body['max_tokens'] = min(case.body['max_tokens'], 8)      # keep each example short; huge values are tested by hand
    response = case.call(timeout=30)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
    ctype = response.headers.get('content-type') or ''
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    if response.status_code >= 400 and ctype.startswith('application/json'):
        assert set(response.json()['error']) == {'message', 'type', 'param', 'code'}

def test_engine_still_healthy_after_fuzzing():
    aeng = _state['aeng']
    assert aeng.running and not aeng.engine.has_unfinished()
