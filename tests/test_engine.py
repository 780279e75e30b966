"The engine issue's acceptance: equality with the reference, batch-invariant seeded sampling, preemption, chunked prefill, bad input."
import pytest, torch
from nanoserve.engine import Engine, EngineConfig
from nanoserve.sampling import SamplingParams
from nanoserve.generate import generate_ids, SampleSpec
from nanoserve.core import RequestError
from nanoserve.kvcache import check_invariants

def prompts16(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (1, 2, 3, 5, 7, 9, 12, 16, 20, 24, 31, 40, 48, 57, 64, 80)]

def run(engine, prompts, params):
    "generate, then check the pool is whole again."
    outs = engine.generate(prompts, params, use_tqdm=False)
    assert engine.cache.pool.num_free == engine.plan.num_blocks and not engine.cache.rows
    check_invariants(engine.cache)
    return outs

# 1. the engine equals the reference, token for token

@pytest.mark.parametrize('kind', ['llama_tied_gqa', 'qwen2_bias', 'qwen3'])
def test_engine_greedy_equals_reference_tiny(tiny, kind):
    engine = Engine.build(tiny(kind), max_batch_size=4, max_num_batched_tokens=64, check_invariants=True, dtype='float32')
    ps = prompts16(engine.model.config.vocab_size)
    outs = run(engine, ps, SamplingParams(temperature=0, max_tokens=24))
    for p, o in zip(ps, outs):
        assert o.token_ids == generate_ids(engine.model, p, SampleSpec(max_tokens=24))[0]

def test_engine_greedy_equals_reference_default_model(default_model):
    engine = Engine.build(default_model, max_batch_size=4, check_invariants=True, dtype='float32')
    questions = ["What is the capital of France?", "Name a colour.", "Count to five.", "What is 2+2?",
                 "Write a haiku about rain.", "Who wrote Hamlet?", "Say hello in Spanish.", "What is water made of?",
                 "Give me a fruit.", "What day comes after Monday?", "Describe the sun in one sentence.", "What is a cat?",
                 "Tell me a fun fact about space, briefly.", "Translate 'thank you' to French.", "What is the largest ocean?",
                 "Recommend a book for a long train journey and say why in a few words."]
    chats = [[{'role': 'user', 'content': q}] for q in questions]
    outs = run(engine, chats, SamplingParams(temperature=0, max_tokens=24))
    for c, o in zip(chats, outs):
        ref, reason = generate_ids(engine.model, engine.tokenizer.encode_chat(c), SampleSpec(max_tokens=24), engine.scheduler.stop_ids)
        assert (o.token_ids, o.finish_reason) == (ref, reason)
    assert 'Paris' in outs[0].text

# 2. batch invariance of seeded sampling

def seeded(i): return SamplingParams(temperature=0.9, top_p=0.95, seed=1000 + i, max_tokens=12, logprobs=5)

def invariance_texts(path, prompts):
    "Each request's text alone, in a crowd of all, and in the crowd in reverse arrival order."
    eng = lambda **kw: Engine.build(path, batch_invariant=True, check_invariants=True, **kw)
    key = lambda o: (o.token_ids, o.logprobs)     # logprobs: the raw logits' log-softmax, compared bit for bit
    alone = [key(run(eng(max_batch_size=1), [p], seeded(i))[0]) for i, p in enumerate(prompts)]
    crowd = [key(o) for o in run(eng(max_batch_size=16, max_num_batched_tokens=96), prompts, [seeded(i) for i in range(len(prompts))])]
    rev = run(eng(max_batch_size=16, max_num_batched_tokens=96), prompts[::-1], [seeded(i) for i in range(len(prompts))][::-1])
    return alone, crowd, [key(o) for o in rev][::-1]

def test_seeded_sampling_is_batch_invariant_tiny(tiny):
    path = tiny('llama_tied_gqa')
    alone, crowd, reverse = invariance_texts(path, prompts16(320, seed=5))
    assert alone == crowd == reverse

def test_seeded_sampling_is_batch_invariant_default_model(default_model):
    qs = ["Tell me a story.", "Describe a forest.", "What is love?", "Invent a new word and define it.",
          "Write a limerick.", "Describe your ideal breakfast.", "What makes a good friend?", "Explain rain to a child."]
    from nanoserve.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(default_model)
    prompts = [tok.encode_chat([{'role': 'user', 'content': q}]) for q in qs]
    alone, crowd, reverse = invariance_texts(default_model, prompts)
    assert alone == crowd == reverse

def test_same_seed_same_text_different_seed_differs(tiny):
    engine = Engine.build(tiny('llama_tied_gqa'), batch_invariant=True, dtype='float32')
    p = prompts16(320)[6]
    a, b, c = run(engine, [p, p, p], [seeded(1), seeded(1), seeded(2)])
    assert a.logprobs == b.logprobs
    assert a.token_ids == b.token_ids != c.token_ids

# 3. preemption

def test_preemption_gives_the_unconstrained_output(tiny):
    path = tiny('llama_untied_mha')
    ps = prompts16(320, seed=3)
    params = [SamplingParams(temperature=0, max_tokens=20) if i % 2 else seeded(i) for i in range(16)]
    free = run(Engine.build(path, batch_invariant=True, max_batch_size=16, max_model_len=128, dtype='float32'), ps, params)
    tight = Engine.build(path, batch_invariant=True, check_invariants=True, max_batch_size=16, max_model_len=128, num_kv_blocks=12, block_size=16, dtype='float32')
    got = run(tight, ps, params)
    assert tight.scheduler.num_preemptions > 0 and any(o.num_preemptions for o in got)
    assert [o.token_ids for o in got] == [o.token_ids for o in free]

def test_preemption_fast_path_greedy(tiny):
    "The fast path too: greedy tokens survive recompute."
    path = tiny('llama_tied_gqa')
    ps = prompts16(320, seed=4)
    g = SamplingParams(temperature=0, max_tokens=20)
    free = run(Engine.build(path, max_batch_size=16, max_model_len=128, dtype='float32'), ps, g)
    tight = Engine.build(path, check_invariants=True, max_batch_size=16, max_model_len=128, num_kv_blocks=12, dtype='float32')
    assert [o.token_ids for o in run(tight, ps, g)] == [o.token_ids for o in free]
    assert tight.scheduler.num_preemptions > 0

# 4. chunked prefill

@pytest.mark.parametrize('invariant', [False, True])
def test_chunked_prefill_equals_unchunked(tiny, invariant):
    path = tiny('llama3_rope')
    long = prompts16(320, seed=9)[-1] * 3                       # 240 tokens
    g = SamplingParams(temperature=0, max_tokens=16)
    whole = Engine.build(path, max_num_batched_tokens=512, batch_invariant=invariant, dtype='float32')
    chunked = Engine.build(path, max_num_batched_tokens=50, batch_invariant=invariant, check_invariants=True, dtype='float32')
    sizes = []
    orig = chunked.scheduler.schedule
    def spy():
        out = orig(); sizes.append([s.num_tokens for s in out.scheduled]); return out
    chunked.scheduler.schedule = spy
    a, b = run(whole, [long], g)[0], run(chunked, [long], g)[0]
    assert sizes[:5] == [[50]] * 4 + [[40]]                      # 240 tokens in five chunks
    assert a.token_ids == b.token_ids

# 5. bad input, refused before any state changes

@pytest.mark.parametrize('prompt,params,message', [
    ('', SamplingParams(), 'the prompt is empty'),
    ([7] * 128, SamplingParams(), 'max_model_len is 128'),
    ('hi', dict(max_tokens=0), 'max_tokens must be an integer >= 1'),
    ('hi', dict(top_p=1.5), 'top_p must be in (0, 1]'),
    ('hi', dict(top_p=0.0), 'top_p must be in (0, 1]'),
    ('hi', dict(temperature=-0.5), 'temperature must be >= 0'),
    ('hi', dict(stop_token_ids=[320]), 'stop_token_ids [320] are not in the vocabulary'),
])
def test_bad_requests_change_nothing(tiny, prompt, params, message):
    engine = Engine.build(tiny('llama_tied_gqa'), max_model_len=128, dtype='float32')
    with pytest.raises(RequestError, match=message.replace('(', r'\(').replace(')', r'\)').replace('[', r'\[').replace(']', r'\]')):
        engine.generate(['fine', prompt], params if isinstance(params, SamplingParams) else SamplingParams(**params), use_tqdm=False)
    assert not engine.scheduler.requests and not engine.scheduler.waiting and engine.cache.pool.num_free == engine.plan.num_blocks

def test_abort_frees_blocks(tiny):
    engine = Engine.build(tiny('llama_tied_gqa'), check_invariants=True, dtype='float32')
    rids = [engine.add_request(p, SamplingParams(max_tokens=50, seed=1)) for p in prompts16(320)[:6]]
    for _ in range(3): engine.step()
    assert engine.cache.pool.num_free < engine.plan.num_blocks
    assert all(engine.abort(r) for r in rids) and not engine.abort(rids[0])
    assert engine.cache.pool.num_free == engine.plan.num_blocks and not engine.has_unfinished()

def test_engine_seeded_sampling_equals_reference(tiny):
    "The engine's sampler draws what the reference draws for the same seed (temperature, top-k, top-p)."
    engine = Engine.build(tiny('llama_tied_gqa'), max_batch_size=4, dtype='float32')
    ps = prompts16(320, seed=8)[4:10]
    specs = [SampleSpec(max_tokens=16, temperature=t, top_k=k, top_p=p, seed=40 + i)
             for i, (t, k, p) in enumerate([(1.0, 0, 1.0), (0.7, 20, 1.0), (1.2, 0, 0.9), (0.9, 50, 0.8), (1.0, 5, 1.0), (0.5, 0, 0.5)])]
    outs = run(engine, ps, [SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed) for s in specs])
    for p, s, o in zip(ps, specs, outs):
        assert o.token_ids == generate_ids(engine.model, p, s)[0]
