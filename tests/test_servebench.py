"The load generator, its reports and the comparisons, against real `nanoserve serve` processes on 127.0.0.1 (tiny models)."
import csv, json, math, shutil, subprocess, sys
from dataclasses import replace
from pathlib import Path
import pytest
from nanoserve.engine import Engine
from nanoserve.sampling import SamplingParams
from nanoserve.tokenizer import Tokenizer
from nanoserve.loadgen import ClientPlan, LoadRun, RequestRecord, Watch, spawn_server, make_plan, run_plan, server_identity
from nanoserve.loadreport import LoadReport, read_concurrency
from nanoserve.servebench import Inconclusive, Regression, bench_serve, compare, load_runs, served_model
from nanoserve.servebench import spread, METRICS

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

@pytest.fixture(scope='module')
def model(tiny, tmp_path_factory):
    "The tiny checkpoint, with a chat template."
    path = tmp_path_factory.mktemp('chat_tiny')
    shutil.copytree(tiny('llama_tied_gqa'), path, dirs_exist_ok=True)
    (path/'tokenizer_config.json').write_text(json.dumps({'chat_template': CHAT_TEMPLATE}))
    return path

@pytest.fixture(scope='module')
def server(model):
    with spawn_server(model, '--dtype', 'float32', '--max-batch-size', '16', '--served-model-name', 'tiny') as (url, _): yield url

@pytest.fixture(scope='module')
def plan(model):
    "16 seeded, sampled completions with mixed prompt lengths and output lengths."
    return make_plan(16, [4, 8, 16, 32], (8, 24), seed=5, temperature=0.8, tokenizer=Tokenizer.from_dir(model))

@pytest.fixture(scope='module')
def offline(model, plan):
    "The offline engine's texts for the plan's prompts and seeds."
    eng = Engine.build(model, max_batch_size=16, dtype='float32')
    outs = eng.generate([q.prompt for q in plan.requests], [SamplingParams(temperature=q.temperature, seed=q.seed, max_tokens=q.max_tokens,
                        ignore_eos=True) for q in plan.requests], use_tqdm=False)
    return [o.text for o in outs], [len(o.prompt_token_ids) for o in outs]

def check_report(run, plan, offline):
    texts, prompt_lens = offline
    rep = LoadReport.of(run)
    assert (rep.num_requests, rep.completed, rep.failed) == (16, 16, 0), rep.errors
    assert rep.output_tokens == sum(q.max_tokens for q in plan.requests)
    assert rep.prompt_tokens == sum(prompt_lens) == sum(q.prompt_len for q in plan.requests)
    assert [r.output_tokens for r in run.records] == [q.max_tokens for q in plan.requests]
    assert run.texts == texts
    assert all(r.finish_reason == 'length' for r in run.records)
    assert rep.ttft.n == 16 and rep.tpot.n == 16 and 0 < rep.ttft.p50 <= rep.ttft.p99 <= rep.e2e.p99
    assert math.isclose(rep.output_throughput, rep.output_tokens / run.duration)
    assert run.server_before == run.server_after is not None
    return rep

def test_crowd_of_16(server, plan, offline):
    run = run_plan(plan, server, 'tiny', 'crowd', watch_interval=0.05)
    rep = check_report(run, plan, offline)
    # batched by the server's own count of the requests each step ran (its /health), not by a reading's timing
    assert rep.concurrency.verdict == 'batched' and rep.concurrency.why.startswith('the server counted'), rep.concurrency
    assert rep.concurrency.peak_running >= 2 and rep.concurrency.peak_in_flight >= 2

@pytest.mark.parametrize('rate', [4.0, 32.0])
def test_open_loop_at_two_rates(server, plan, offline, rate):
    timed = plan.at_rate(rate, seed=1)
    run = run_plan(timed, server, 'tiny', 'open')
    check_report(run, plan, offline)
    lateness = [r.sent - q.arrival for r, q in zip(run.records, timed.requests)]
    assert all(x >= 0 for x in lateness), lateness                   # never before its arrival time (how late, under load, is not a test's business)
    assert LoadReport.of(run).rate == rate

def test_chat_crowd_matches_offline(server, model):
    plan = make_plan(8, (4, 12), 12, kind='chat', seed=2, temperature=0.7)
    run = run_plan(plan, server, 'tiny', 'crowd', max_concurrency=3)
    eng = Engine.build(model, max_batch_size=8, dtype='float32')
    outs = eng.generate([[{'role': 'user', 'content': q.prompt}] for q in plan.requests],
                        [SamplingParams(temperature=0.7, seed=q.seed, max_tokens=12, ignore_eos=True) for q in plan.requests], use_tqdm=False)
    assert run.texts == [o.text for o in outs]
    assert LoadReport.of(run).concurrency.peak_in_flight == 3               # the semaphore bounded the crowd

def test_percentiles_on_hand_made_timestamps():
    "10 requests: send at i/10, first chunk 0.1*(i+1) later, then chunks every 0.02*(i+1) s, 5 tokens each."
    recs = []
    for i in range(10):
        first = i / 10 + 0.1 * (i + 1)
        chunks = [first + k * 0.02 * (i + 1) for k in range(5)]
        recs.append(RequestRecord(i, i / 10, chunks, chunks[-1] + 0.001, 'abcde', 7, 5, 'length'))
    run = LoadRun(make_plan(10, 4, 5), 'crowd', 'http://127.0.0.1:1', 'm', recs, recs[-1].done, Watch())
    rep = LoadReport.of(run)
    ttfts = [0.1 * (i + 1) for i in range(10)]                                 # 0.1 .. 1.0
    assert math.isclose(rep.ttft.p50, 0.55) and math.isclose(rep.ttft.p90, 0.91) and math.isclose(rep.ttft.p99, 0.991)
    assert math.isclose(rep.ttft.mean, sum(ttfts) / 10)
    itls = sorted(0.02 * (i + 1) for i in range(10) for _ in range(4))       # 40 gaps: 0.02 .. 0.2, four each
    assert rep.itl.n == 40 and math.isclose(rep.itl.p50, 0.11)               # between the 20th (0.10) and 21st (0.12)
    assert math.isclose(rep.itl.p99, itls[38] + 0.61 * (itls[39] - itls[38]))
    tpots = [(0.08 * (i + 1) + 0.001) / 4 for i in range(10)]                 # (e2e - ttft) / (5 - 1)
    assert math.isclose(rep.tpot.p50, (tpots[4] + tpots[5]) / 2)
    assert math.isclose(rep.e2e.p99, sorted(r.done - r.sent for r in recs)[8] + 0.91 * (sorted(r.done - r.sent for r in recs)[9] - sorted(r.done - r.sent for r in recs)[8]))
    assert (rep.prompt_tokens, rep.output_tokens) == (70, 50)
    assert math.isclose(rep.request_throughput, 10 / run.duration)

@pytest.fixture(scope='module')
def same_server_runs(server, model):
    plan = make_plan(32, (4, 24), 48, seed=3)
    a = bench_serve(server, 'tiny', plan, rates=(), repeats=3, watch_interval=0.05, label='A', log=lambda m: None)
    b = bench_serve(server, 'tiny', plan, rates=(), repeats=3, watch_interval=0.05, label='B', log=lambda m: None)
    return plan, a, b

def test_identical_runs_are_not_a_regression(same_server_runs):
    "The verdict logic on recorded runs: the same three runs relabelled are no change (a live A/B verdict belongs in benchmarks, not tests)."
    _, a, _ = same_server_runs
    c = compare(a, [replace(x, label='B') for x in a])
    assert {r.metric for r in c.rows} == {'output_throughput', 'ttft_p50', 'tpot_p50', 'itl_p50', 'e2e_p50'}
    assert all(r.verdict != 'worse' for r in c.rows)

def slowed(run: LoadRun, k: float) -> LoadRun:
    "The run as a k-times slower server would have recorded it."
    f = lambda t: None if t is None else t * k
    recs = [replace(r, sent=f(r.sent), chunk_times=[t * k for t in r.chunk_times], done=f(r.done)) for r in run.records]
    return replace(run, records=recs, duration=run.duration * k, label='slowed',
                   watch=replace(run.watch, samples=[(t * k, n, w) for t, n, w in run.watch.samples]))

def test_synthetic_regression_is_flagged(same_server_runs):
    _, a, _ = same_server_runs
    # slowed beyond the widest band the live repeats allow (a slowed copy keeps A's spread), so that a loaded machine's
    # noisy repeats cannot hide it: k - 1 = 1.4 + 2 x the spread, against a band of 0.2 + the spread (as Day 42 does)
    costs = [[cost(LoadReport.of(x)) for x in a] for cost in METRICS.values()]
    spreads = [spread(v) for v in costs if not any(map(math.isnan, v))]
    k = 2 + 2 * (0.2 + max(spreads))
    with pytest.raises(Regression) as e: compare(a, [slowed(x, k) for x in a])
    rows = {r.metric: r for r in e.value.comparison.rows}
    assert set(rows) == {'output_throughput', 'ttft_p50', 'tpot_p50', 'itl_p50', 'e2e_p50'}
    assert all(math.isclose(r.change, k - 1) for r in rows.values())
    assert {'output_throughput', 'tpot_p50', 'itl_p50', 'e2e_p50'} <= {m for m, r in rows.items() if r.verdict == 'worse'}
    assert all((r.verdict == 'worse') == (r.change > r.threshold) for r in rows.values())
    compare([slowed(x, k) for x in a], a)                           # the other way is an improvement, not an error
    with pytest.raises(Regression): compare(a[0], slowed(a[0], 1.5))       # one run each: the tolerance alone (20%)

def test_refusals(same_server_runs, model):
    plan, a, b = same_server_runs
    with pytest.raises(Inconclusive, match='different plans'): compare(a[0], replace(b[0], plan=make_plan(32, (4, 24), 48, seed=4)))
    wrong = replace(b[0], records=[replace(r, text=r.text + 'x') if r.index in (3, 9) else r for r in b[0].records])
    with pytest.raises(Inconclusive, match='different answers for 2 of 32 requests'): compare(a[0], wrong)
    with pytest.raises(Inconclusive, match='restarted during the run'): compare(a[0], replace(b[0], server_after='0123'))
    compare(a, [replace(x, label='B') for x in a], same_server=True)        # recorded runs of one server process: no refusal
    with pytest.raises(Inconclusive, match='restarted between A and B'):
        compare(a[0], replace(b[0], server_before='0123', server_after='0123'), same_server=True)
    failed = replace(b[0], records=[replace(r, error='HTTP 500: boom') if r.index == 0 else r for r in b[0].records])
    with pytest.raises(Inconclusive, match='B has 1 failed requests'): compare(a[0], failed)
    with spawn_server(model, '--dtype', 'float32', '--max-batch-size', '1') as (url, _):
        serial = run_plan(plan, url, served_model(url), 'crowd', watch_interval=0.05)
    assert read_concurrency(serial.records, serial.watch).verdict == 'serialised'
    with pytest.raises(Inconclusive, match='B asked for a crowd but it was never crowded: serialised') as e: compare(a[0], serial)
    assert isinstance(e.value, Inconclusive) and not isinstance(e.value, Regression)

def test_a_restart_changes_the_identity(model, server):
    import asyncio, httpx
    async def ident(url):
        async with httpx.AsyncClient(base_url=url) as c: return await server_identity(c)
    with spawn_server(model, '--dtype', 'float32') as (other, _): assert asyncio.run(ident(other)) != asyncio.run(ident(server)) is not None

def test_cli_bench_serve_and_compare(model, tmp_path):
    """`bench serve` and `bench compare` on a tiny server: 100 tokens a request, 4 rows for 12 requests (the crowd's verdict is the
    server's own count of the requests each step ran, whatever a reading every 50 ms catches)."""
    out = tmp_path/'out'
    cmd = [NANOSERVE, 'bench', 'serve', '--model', str(model), '--rates', '8', '--num-requests', '12', '--input-len', '4:12',
           '--output-len', '100', '--watch-interval', '0.05', '--out', str(out), '--name', 'tiny', '--serve-args', '--max-batch-size 4', '--save-plan', str(tmp_path/'plan.json')]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(out/'tiny.csv')))
    assert [(x['mode'], x['completed'], x['failed']) for x in rows] == [('crowd', '12', '0'), ('open', '12', '0')]
    assert float(rows[1]['rate']) == 8.0 and int(rows[0]['output_tokens']) == 1200
    assert (out/'tiny.png').stat().st_size > 10_000 and 'ttft_p99_ms' in r.stdout
    runs = load_runs(out/'tiny.runs.jsonl')
    assert [x.plan.fingerprint for x in runs] == [ClientPlan.load(tmp_path/'plan.json').as_crowd().fingerprint, runs[1].plan.fingerprint]
    same = subprocess.run([NANOSERVE, 'bench', 'compare', str(out/'tiny.runs.jsonl'), str(out/'tiny.runs.jsonl')], capture_output=True, text=True)
    assert same.returncode == 0 and 'no regression' in same.stdout, same.stdout + same.stderr
    other = tmp_path/'other.runs.jsonl'
    other.write_text(''.join(replace(x, plan=make_plan(12, 4, 100, seed=9).as_crowd() if x.mode == 'crowd' else x.plan).to_json() + '\n' for x in runs))
    diff = subprocess.run([NANOSERVE, 'bench', 'compare', str(out/'tiny.runs.jsonl'), str(other)], capture_output=True, text=True)
    assert diff.returncode == 3 and 'different plans' in diff.stdout, diff.stdout
    bad = subprocess.run([NANOSERVE, 'bench', 'serve', '--model', str(model), '--url', 'http://127.0.0.1:1'], capture_output=True, text=True)
    assert bad.returncode == 2 and 'not both' in bad.stderr
    far = subprocess.run([NANOSERVE, 'bench', 'serve', '--url', 'http://10.1.2.3:8000'], capture_output=True, text=True)
    assert far.returncode == 2 and 'only targets loopback' in far.stderr

