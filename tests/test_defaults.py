"What a request that leaves fields out gets, through a live server and the real openai client: the model's generation_config.json sets the sampling defaults (a request's own value wins), `--generation-config none` restores the API's, and completions keep OpenAI's 16 tokens."
import json, shutil
import pytest
from openai import OpenAI
from nanoserve.engine import Engine
from nanoserve.sampling import SamplingParams
from nanoserve.loadgen import spawn_server

PROMPT = 'hello world'

@pytest.fixture(scope='module')
def greedy_by_default(peaky, tmp_path_factory):
    "The peaky tiny checkpoint with a generation_config.json that makes greedy (temperature 0) the default."
    d = tmp_path_factory.mktemp('gen')/'model'
    shutil.copytree(peaky, d)
    (d/'generation_config.json').write_text(json.dumps({'temperature': 0.0, 'top_p': 1.0}))
    return d

@pytest.fixture(scope='module')
def offline(greedy_by_default):
    engine = Engine.build(greedy_by_default, dtype='float32')
    return lambda **kw: engine.generate([PROMPT], SamplingParams(**kw), use_tqdm=False)[0].text

def complete(url, **kw):
    r = OpenAI(base_url=url + '/v1', api_key='none').completions.create(model='model', prompt=PROMPT, **kw)
    return r.choices[0].text, r.usage.completion_tokens

def test_generation_config_sets_the_default_and_the_request_wins(greedy_by_default, offline):
    greedy, sampled = offline(temperature=0, max_tokens=12), offline(temperature=1.0, seed=7, max_tokens=12)
    assert greedy != sampled, 'seed 7 at temperature 1 must differ from greedy, or the test shows nothing'
    with spawn_server(greedy_by_default, '--dtype', 'float32') as (url, _):
        assert complete(url, seed=7, max_tokens=12)[0] == greedy                     # the file's temperature 0: the seed draws nothing
        assert complete(url, seed=7, max_tokens=12, temperature=1.0)[0] == sampled   # the request's own value wins
        assert complete(url)[1] == 16                                                # completions without max_tokens: OpenAI's 16
        models = OpenAI(base_url=url + '/v1', api_key='none').models.list().model_dump()['data'][0]
        assert models['request_defaults']['sampling'] == {'temperature': 0.0, 'top_p': 1.0}

def test_generation_config_none_restores_the_api_defaults(greedy_by_default, offline):
    sampled = offline(temperature=1.0, seed=7, max_tokens=12)
    with spawn_server(greedy_by_default, '--dtype', 'float32', '--generation-config', 'none') as (url, _):
        assert complete(url, seed=7, max_tokens=12)[0] == sampled                    # temperature 1.0, the API's default
        models = OpenAI(base_url=url + '/v1', api_key='none').models.list().model_dump()['data'][0]
        assert models['request_defaults'] == {'max_tokens': {'chat': 'the rest of the context', 'completions': 16}, 'sampling': {}}

def test_a_broken_generation_config_is_refused_at_boot(greedy_by_default, tmp_path):
    import subprocess, sys
    from pathlib import Path
    bad = tmp_path/'bad'
    shutil.copytree(greedy_by_default, bad)
    (bad/'generation_config.json').write_text(json.dumps({'top_p': 7}))
    r = subprocess.run([str(Path(sys.executable).parent/'nanoserve'), 'serve', '--model', str(bad), '--port', '0'], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and 'generation_config.json: top_p' in r.stderr and '--generation-config none' in r.stderr
