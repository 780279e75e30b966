"""Day 63, speculative decoding with a draft model (`--speculative draft`): the default model drafting for itself in
int4 (its LM head too) gives greedy tokens and logprobs identical to plain decoding, through the decode call, with its
proposals mostly kept; sampled requests are checked by rejection sampling, whose first checked position follows the
model's distribution (a chi-square over 4,000 seeds, on the real tiny models' distributions); on the tiny model, random
arrivals, aborts and preemption leave the KV pool's bookkeeping whole and nothing leaked; the refusals (a draft with
another vocabulary among them, before anything is served); and a real server streams it to the openai client."""
import re
import shutil
import pytest
import torch
import transformers
from hypothesis import given, settings, HealthCheck, strategies as st
from nanoserve.core import ConfigError
from nanoserve.engine import Engine, EngineConfig
from nanoserve.grammar import Structured, allowed_tokens
from nanoserve.launch import build_engine
from nanoserve.model import DenseKV
from nanoserve.offline_bench import make_workload, text_workload
from nanoserve.sampling import SamplingParams
from nanoserve.scheduler import SamplingState, ScheduledRequest
from nanoserve.tiny import tiny_checkpoint
from test_speculative import chi_square_ok, crowd_with_aborts, outputs, plain_and_speculating


@pytest.fixture(scope='module')
def default_engines(default_model):
    kw = dict(dtype='bfloat16', max_batch_size=4, max_model_len=1024)
    return build_engine(default_model, **kw), build_engine(default_model, **kw, speculative='draft',
                                                           num_speculative_tokens=4)


def test_the_int4_self_draft_is_built_as_documented(default_engines):
    "No --draft-model: the served model's own checkpoint, its layers and LM head in int4, through the decode call."
    _, spec = default_engines
    draft = spec.scheduler.proposer
    assert draft.model.quantization == 'int4' and draft.model.head_quantization == 'int4'
    assert draft.runner.decode_call is not None and draft.runner.decode_call.quant == 'q4'
    assert draft.cache.slots is spec.cache.slots and draft.cache.k.data_ptr() != spec.cache.k.data_ptr()


@pytest.mark.parametrize('kind', ['random', 'extractive'])
def test_greedy_output_unchanged_on_the_default_model(default_engines, kind):
    plain, spec = default_engines
    w = (make_workload(4, (32, 96), 64, plain.model.config.vocab_size, seed=1) if kind == 'random'
         else text_workload(kind, plain.tokenizer, 4, 96, seed=1))
    params = SamplingParams(max_tokens=w.output_len, temperature=0, logprobs=2, ignore_eos=kind == 'random')
    s = spec.scheduler
    drafts, accepted = s.num_draft_tokens, s.num_accepted_tokens
    assert outputs(spec, w.prompts, params) == outputs(plain, w.prompts, params)
    # the int4 draft agrees with the model on most tokens
    assert s.num_accepted_tokens - accepted > (s.num_draft_tokens - drafts) / 2


def test_sampled_requests_are_repeatable_and_speculate(default_engines):
    "A seeded sampled crowd: the same arrivals give the same tokens again, with proposals kept and redrawn."
    _, spec = default_engines
    w = text_workload('extractive', spec.tokenizer, 4, 64, seed=3)
    params = SamplingParams(max_tokens=64, temperature=0.8, top_p=0.95, seed=11, logprobs=1)
    s = spec.scheduler
    drafts, accepted = s.num_draft_tokens, s.num_accepted_tokens
    first = outputs(spec, w.prompts, params)
    assert outputs(spec, w.prompts, params) == first
    assert 0 < s.num_accepted_tokens - accepted < s.num_draft_tokens - drafts


@pytest.fixture(scope='module')
def tiny_pair(peaky, tmp_path_factory):
    "The peaky tiny model and a draft of it with its weights disturbed (the same tokenizer)."
    path = tmp_path_factory.mktemp('draft')
    for f in peaky.iterdir():
        if f.is_file(): shutil.copy(f, path / f.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(peaky)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters(): p.add_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(path)
    return peaky, path


@pytest.fixture(scope='module')
def tiny_engines(tiny_pair):
    target, draft = tiny_pair
    plain = Engine.build(target, max_batch_size=1, max_model_len=128, dtype='float32')
    # four rows over 12 blocks (192 tokens): a crowd preempts; every step's bookkeeping checked
    spec = Engine.build(target, max_batch_size=4, max_model_len=128, num_kv_blocks=12, dtype='float32',
                        check_invariants=True, speculative='draft', draft_model=str(draft), draft_quantization='none',
                        num_speculative_tokens=3)
    return plain, spec


request = st.fixed_dictionaries({
    'prompt': st.lists(st.integers(3, 250), min_size=1, max_size=40),
    'max_tokens': st.integers(1, 40), 'arrive': st.integers(0, 6), 'abort': st.one_of(st.none(), st.integers(0, 30)),
    'temperature': st.sampled_from([0.0, 0.0, 0.9]), 'seed': st.integers(0, 1000)})


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(request, min_size=1, max_size=8))
def test_tiny_crowd_with_aborts_and_preemption(tiny_engines, reqs):
    """Greedy requests' tokens are their solo plain tokens; sampled ones run to their length; nothing leaks and the
    draft forgets every request it knew."""
    plain, eng = tiny_engines
    params = lambda r: SamplingParams(max_tokens=r['max_tokens'], temperature=r['temperature'], seed=r['seed'],
                                      ignore_eos=True)
    for rid, i, out in crowd_with_aborts(eng, reqs, params):
        assert len(out.token_ids) == reqs[i]['max_tokens']
        if reqs[i]['temperature'] == 0:
            alone = plain.generate([reqs[i]['prompt']], params(reqs[i]), use_tqdm=False)[0]
            assert out.token_ids == alone.token_ids, (i, reqs[i])
    assert eng.cache.pool.num_free == eng.cache.pool.num_blocks and not eng.cache.rows    # nothing leaked
    assert not eng.scheduler.proposer.computed


def test_the_tiny_crowd_drafts_and_preempts(tiny_engines):
    "The examples above exercise what they claim: proposals kept and rejected, and preemption."
    _, eng = tiny_engines
    s = eng.scheduler
    drafts, accepted, preempted = s.num_draft_tokens, s.num_accepted_tokens, s.num_preemptions
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 250, (30,), generator=g).tolist() for _ in range(6)]
    eng.generate(prompts, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), use_tqdm=False)
    assert 0 < s.num_accepted_tokens - accepted < s.num_draft_tokens - drafts and s.num_preemptions > preempted


def test_checked_positions_follow_the_models_distribution(tiny_engines):
    """Rejection sampling in the runner, on the tiny models' own distributions at one position (the model's p, the
    disturbed draft's q, at temperature 3, where about a third of the proposals are kept): over 8,000 seeds, a proposal
    drawn from q and checked gives tokens that follow p, while the proposals themselves (q's draws) do not. Drawing a
    rejected position from p instead of the residual moves the statistic by about 1,000, far past the bound."""
    _, eng = tiny_engines
    draft = eng.scheduler.proposer
    prompt = [5, 17, 42, 9, 100, 33]
    params = SamplingParams(temperature=3.0, max_tokens=10, ignore_eos=True)
    ids, pos = torch.tensor(prompt), torch.arange(len(prompt))
    with torch.inference_mode():
        p_logits, q_logits = (m.compute_logits(m(ids, pos, DenseKV(m.config.num_hidden_layers).step([len(ids)]))[-1:])
                              for m in (eng.model, draft.model))
    p, q = (torch.softmax(x[0].float() / 3.0, -1) for x in (p_logits, q_logits))
    logits = torch.cat([p_logits, p_logits])               # the proposal's position, and the one after it
    firsts, proposed = [], []
    for seed in range(8000):
        g = torch.Generator().manual_seed(seed)
        d = int(torch.multinomial(q, 1, generator=g))
        s = ScheduledRequest('r', 0, [prompt[-1], d], len(prompt) - 1, SamplingState(params, g, prompt[:-1], []),
                             (d,), (q,))
        out = eng.runner.check_proposals(logits, [s])
        firsts.append(out.token_ids[0])
        proposed.append(d)
    assert 0.2 < sum(a == b for a, b in zip(firsts, proposed)) / 8000 < 0.8    # some kept, some redrawn
    assert chi_square_ok(firsts, p) and not chi_square_ok(proposed, p)


def test_refusals(default_model, tiny_pair, tmp_path):
    for kw, words in ((dict(draft_model='x'), 'add --speculative draft'),
                      (dict(speculative='ngram', draft_quantization='int4'), 'add --speculative draft'),
                      (dict(speculative='draft', draft_quantization='int2'), 'must be none, int8, int4, w8a8 or w4a8'),
                      (dict(speculative='draft', tensor_parallel_size=2), 'not built yet')):
        with pytest.raises(ConfigError, match=words): EngineConfig(**kw)
    target, _ = tiny_pair
    other = tiny_checkpoint(tmp_path / 'other', vocab_size=200, max_position_embeddings=128)
    with pytest.raises(ConfigError, match="must share the served model's tokenizer"):
        Engine.build(target, dtype='float32', speculative='draft', draft_model=str(other), draft_quantization='none')
    with pytest.raises(ConfigError, match='Engine.build assembles the eager engine only'):
        Engine.build(target, dtype='float32', speculative='draft')


def test_server_streams_the_same_text(default_model):
    "A real server with --speculative draft streams, through the openai client, the text a plain server returns."
    msgs = [{'role': 'user', 'content': "Write two sentences about the sea."}]
    (plain, _), (text, health, metrics) = plain_and_speculating(default_model, msgs, 'draft')
    info = health['speculative']
    assert info['method'] == 'draft' and info['draft']['quantization'] == 'int4'
    assert info['draft']['head_quantization'] == 'int4' and info['draft']['kv_bytes'] > 0
    accepted = re.search(r'^vllm:spec_decode_num_accepted_tokens_total\{model_name="smol"\} (\S+)$', metrics, re.M)
    assert float(accepted.group(1)) > 0
    assert plain and plain == text


def test_structured_output_proposals_follow_the_grammars_distribution(tiny_engines):
    """Rejection sampling with structured output: the model's distribution limited to what the grammar allows, the
    draft's proposal drawn from its own limited one (the scheduler passes only proposals the grammar allows; the runner
    renormalises q over them). Over 8,000 seeds the first position follows the limited p, and the matcher is where it
    was after every check."""
    _, eng = tiny_engines
    draft = eng.scheduler.proposer
    prompt = [5, 17, 42, 9, 100, 33]
    spec = Structured.regex('[a-m]+')
    matcher = eng.grammars.matcher(spec)
    params = SamplingParams(temperature=3.0, max_tokens=10, ignore_eos=True, structured=spec)
    ids, pos = torch.tensor(prompt), torch.arange(len(prompt))
    with torch.inference_mode():
        p_logits, q_logits = (m.compute_logits(m(ids, pos, DenseKV(m.config.num_hidden_layers).step([len(ids)]))[-1:])
                              for m in (eng.model, draft.model))
    allowed = allowed_tokens(eng.grammars, [matcher])[0]
    assert 5 < int(allowed.sum()) < eng.model.config.vocab_size / 2
    p, q = (torch.softmax(x[0].float() / 3.0, -1) for x in (p_logits, q_logits))
    limited = lambda d: d.masked_fill(~allowed, 0) / d.masked_fill(~allowed, 0).sum()
    logits = torch.cat([p_logits, p_logits])
    firsts, proposed = [], []
    for seed in range(8000):
        g = torch.Generator().manual_seed(seed)
        d = int(torch.multinomial(limited(q), 1, generator=g))
        s = ScheduledRequest('r', 0, [prompt[-1], d], len(prompt) - 1,
                             SamplingState(params, g, prompt[:-1], [], matcher), (d,), (q,))
        firsts.append(eng.runner.check_proposals(logits, [s]).token_ids[0])
        proposed.append(d)
    assert all(allowed[t] for t in firsts) and matcher.validate(firsts[:1]) == 1
    assert 0.2 < sum(a == b for a, b in zip(firsts, proposed)) / 8000 < 0.9
    assert chi_square_ok(firsts, limited(p)) and not chi_square_ok(proposed, limited(p))


def test_structured_output_greedy_is_unchanged(default_engines):
    "A greedy request with structured output, drafted for: the plain engine's tokens, with proposals kept."
    from test_speculative import structured_cases
    plain, spec = default_engines
    msgs, specs = structured_cases()
    s = spec.scheduler
    accepted = s.num_accepted_tokens
    for st in specs:
        params = SamplingParams(max_tokens=120, temperature=0, structured=st, logprobs=1)
        assert outputs(spec, msgs, params) == outputs(plain, msgs, params)
    assert s.num_accepted_tokens > accepted


def test_bench_offline_drafts_at_both_batches(default_model, tmp_path):
    """`nanoserve bench offline --speculative draft`: its batch-1 engine shares the crowd engine's loaded model, and the
    self-draft still finds the model's directory to load its int4 copy from."""
    import csv, subprocess
    from test_speculative import NANOSERVE
    out = tmp_path / 'offline.csv'
    done = subprocess.run([NANOSERVE, 'bench', 'offline', '--model', str(default_model), '--dtypes', 'bfloat16',
                           '--num-requests', '2', '--output-len', '32', '--batch1-requests', '1', '--workload',
                           'random', '--speculative', 'draft', '--csv', str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 2 and all(0 < int(r['accepted_tokens']) <= int(r['draft_tokens']) for r in rows)
