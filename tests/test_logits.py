"""The logits are float32 sums on every path that computes them: an LM head never rounds its float32 accumulators to bfloat16
(whose step of 0.125 near the default model's logits tied the README's own question's first token on a Zen 4 machine)."""
import math
import pytest
from nanoserve.launch import build_engine
from nanoserve.quant import quantize_model
from nanoserve.sampling import SamplingParams

QUESTION = [{'role': 'user', 'content': 'What is the capital of France?'}]
# each way a bfloat16 step's logits can be computed on this CPU: the decode call (the default, batch-invariant), the layers'
# forward, oneDNN's products without the own kernels, the recorded decode of --cuda-graphs, int8 layers (the head stays bfloat16)
PATHS = {'decode call': {}, 'layers': dict(decode_call=False), 'oneDNN': dict(amx_linear=False, batch_invariant=False),
         'recorded decode': dict(bucket_decode=True, persist_inputs=True, capture_decode=True, max_model_len=256),
         'int8 layers': dict(quantization='int8')}

def on_bf16_grid(logprobs: dict, step: float = 2 ** -7, tol: float = 1e-5) -> bool:
    """Whether a position's top logprobs differ from each other by multiples of `step`, as logits rounded to bfloat16 do (at
    magnitudes of 1 and above its step is 2^-7 or coarser; a logprob is the logit less one float32 log-sum-exp)."""
    lps = sorted(logprobs.values(), reverse=True)
    return all(abs((lps[0] - v) / step - round((lps[0] - v) / step)) * step < tol for v in lps[1:])

@pytest.fixture(scope='module')
def answers(default_model):
    got = {}
    for name, kw in PATHS.items():
        engine = build_engine(default_model, dtype='bfloat16', max_batch_size=4, quantize=quantize_model, **kw)
        params = SamplingParams(temperature=0, max_tokens=24, logprobs=5)
        out = engine.generate([QUESTION], params, use_tqdm=False)[0]
        got[name] = out, took_path(name, engine)
        engine.close()
    return got

def took_path(name: str, engine) -> bool:
    "Whether the engine's own counters say its decode steps went the way `name` says."
    call, path = engine.runner.decode_call, engine.decode_path
    if name == 'recorded decode': return path is not None and path.replays > 0
    if name == 'layers': return call is None and path is None
    if name == 'oneDNN': return call is None and engine.model.lm_head.amx is None and engine.model.lm_head.packed is not None
    if name == 'int8 layers': return call is not None and call.quant == 'q8'
    return call is not None and engine.model.fast['invariant']

@pytest.mark.parametrize('path', PATHS)
def test_logprobs_are_not_on_bfloat16s_grid(answers, path):
    "With logits rounded to bfloat16 every position's top-5 would sit on its grid; float32 sums almost never do."
    out, took = answers[path]
    assert took, f"the engine did not take the {path} path"
    assert len(out.logprobs) >= 5 and all(len(p) == 5 for p in out.logprobs)
    on_grid = sum(on_bf16_grid(p) for p in out.logprobs)
    assert on_grid <= len(out.logprobs) // 4, f"{on_grid} of {len(out.logprobs)} positions look rounded to bfloat16 ({path})"
    assert all(math.isfinite(v) for p in out.logprobs for v in p.values())

def test_the_readmes_question_greedy_names_paris(answers):
    "The README's own question, greedy, in the default mode (bfloat16, batch-invariant): Paris."
    text = answers['decode call'][0].text
    assert 'Paris' in text, text
