"Day 57, graphbench: the seven checks tripped and passed on real tiny servers (and, for timings and for what a real run cannot be made to do on cue, on real runs edited); /health's two halves; the crowd against a solo client; bench graph's CLI."
import copy, csv, subprocess, sys
from dataclasses import replace
from pathlib import Path
import httpx, pytest
from nanoserve.loadgen import Watch, make_plan, run_plan, spawn_server
from holes import hole, scattered, SHORT, LONG
from nanoserve.servebench import Regression, Inconclusive, served_model
from nanoserve.capture import check_all_shapes_captured, check_no_scattered_rows, ScatteredRows, ShapesNotCaptured
from nanoserve.graphbench import (ArmDelta, run_arm, wait_idle, check_same_answers, check_arm_was_crowded, check_arm_replayed,
                                  check_arm_replayed_every_step, check_nothing_recorded_while_serving, check_arms_comparable,
                                  check_tail_not_worse, check_report, graph_checks)

NANOSERVE = str(Path(sys.executable).parent/'nanoserve')
# float32 on every machine: the arms' answers are compared text for text, and bfloat16 (the default where the CPU has it) rounds a
# crowd's decodes differently in a mixed step (one product of all its rows) than alone (the AMX kernel's), which a near-tie shows
SMALL = ('--max-batch-size', '4', '--max-model-len', '256', '--dtype', 'float32')
HOST = SMALL + ('--cuda-graphs', '--capture-recorder', 'host', '--no-persistent-batch')   # Day 57's arms; Day 58's batch: test_batch.py
MIXED = make_plan(12, (4, 12), (16, 64), seed=3, name='mixed crowd')          # requests of different lengths: the crowd
UNIFORM = make_plan(8, 6, 24, seed=5, name='uniform crowd')                   # all the same length
PLANS = [MIXED, MIXED.at_rate(16.0, seed=4)]

@pytest.fixture(scope='module')
def arms(tiny):
    path = tiny('llama_tied_gqa')
    return {'eager': run_arm('eager', SMALL, PLANS, path), 'host': run_arm('host', HOST, PLANS, path), 'path': path}

def test_health_has_both_halves_and_the_gates_read_it(tiny):
    with spawn_server(tiny('llama_tied_gqa'), '--dtype', 'float32', *HOST) as (url, _):
        h0 = httpx.get(url + '/health').json()
        run_plan(make_plan(4, 8, 12, seed=1), url, served_model(url), 'crowd')
        h1 = wait_idle(url)
        m = httpx.get(url + '/metrics').text
    for h in (h0, h1): assert {'warm', 'count', 'max_width', 'width_bound_by', 'runtime'} <= set(h['cuda_graphs']) and 'runtime' not in h
    assert h0['cuda_graphs']['runtime']['decode_steps'] == 0 < h1['cuda_graphs']['runtime']['decode_steps']
    assert h1['cuda_graphs']['runtime']['replays'] > h0['cuda_graphs']['runtime']['replays'] == 0
    check_all_shapes_captured(h1)
    lying = copy.deepcopy(h1); lying['cuda_graphs']['runtime']['recorded'] = 1
    with pytest.raises(ShapesNotCaptured): check_all_shapes_captured(lying)
    with pytest.raises(ScatteredRows): check_no_scattered_rows(h1, -1.0)                 # the JSON goes through every gate
    assert 'nanoserve_capture_replays_total' in m and 'nanoserve_capture_fallbacks' in m

def test_same_answers_needs_the_crowd(arms):
    """The prefix rule off: a hole in the rows catches it and a solo client of the same arm does not. A crowd leaves holes
    where the order the server received it puts them (none, in some runs); the hole here is made on cue (tests/holes.py):
    a short request in row 0, a long one in row 1 that decodes on alone after it."""
    path, broken = arms['path'], HOST + ('--no-capture-prefix-rule',)
    check_same_answers(arms['eager'], arms['host'])                                                 # passes
    texts = {}
    for name, args in (('eager', SMALL), ('host', HOST), ('ruleless', broken)):
        with spawn_server(path, *args) as (url, _):
            texts[name], before, after = hole(url, served_model(url))
        if name == 'host': assert scattered(before, after) >= LONG - SHORT      # the rule saw the hole: the forward ran
    assert texts['host'] == texts['eager'] and texts['ruleless'][0] == texts['eager'][0]
    assert texts['ruleless'][1] != texts['eager'][1]              # the long one, replayed over row 0's keys after the hole
    solo_eager, solo_broken = run_arm('eager solo', SMALL, PLANS[:1], path, max_concurrency=1), run_arm('broken solo', broken, PLANS[:1], path, max_concurrency=1)
    check_same_answers(solo_eager, solo_broken)
    assert solo_broken.window.scattered_calls == 0 < solo_broken.window.decode_steps

def test_arm_was_crowded(arms):
    check_arm_was_crowded(arms['host'])
    serial = run_arm('one at a time', ('--max-batch-size', '1', '--max-model-len', '256', '--dtype', 'float32'), PLANS[:1], arms['path'])
    with pytest.raises(Inconclusive, match="one at a time's crowd was not crowded: the server ran one request at a time"): check_arm_was_crowded(serial)
    unseen = replace(arms['host'], crowd=replace(arms['host'].crowd, watch=Watch(0.05, 'health', [])))   # no reading fell inside the crowd
    with pytest.raises(Inconclusive, match='the crowd was too short to observe'): check_arm_was_crowded(unseen)

def test_arm_replayed(arms):
    check_arm_replayed(arms['host'])
    with pytest.raises(Inconclusive, match='eager publishes no capture counters'): check_arm_replayed(arms['eager'])
    idle = replace(arms['host'], after=arms['host'].before)                                            # a window with nothing in it
    with pytest.raises(Inconclusive, match='host replayed none of its 0 decode steps'): check_arm_replayed(idle)

def test_arm_without_the_batch_did_not_replay_every_step(arms):
    """Without the persistent batch (Day 58's job) a hole in the rows runs the forward, not a replay; the check reads it
    from the server's counters over the pair that makes the hole (tests/holes.py)."""
    with spawn_server(arms['path'], *HOST) as (url, _):
        _, before, after = hole(url, served_model(url))
    with pytest.raises(Inconclusive, match=r'host: \d+ of \d+ decode steps replayed .* below 100%; fallbacks: .*scattered'):
        check_arm_replayed_every_step(replace(arms['host'], before=before, after=after))

def test_arm_replayed_every_step(arms):
    solo = run_arm('host, solo', HOST, [UNIFORM], arms['path'], max_concurrency=1)                   # one at a time: always row 0
    check_arm_replayed_every_step(solo)
    assert solo.window.replays == solo.window.decode_steps > 0
    # (through a socket even a uniform crowd scatters a few steps: requests arrive a step apart, finish a step apart, and a new
    #  one takes the lowest free row behind the survivors; the coverage table, which admits a wave in one step, replays 100%)

def test_nothing_recorded_while_serving(arms):
    check_nothing_recorded_while_serving(arms['host'])
    lazy = run_arm('host, no warm', HOST + ('--no-warm',), PLANS[:1], arms['path'])
    with pytest.raises(Regression, match=r'host, no warm recorded \d+ shapes while serving'): check_nothing_recorded_while_serving(lazy)

def test_arms_comparable(arms):
    check_arms_comparable(arms['eager'], arms['host'])
    other = run_arm('other plan', HOST, [make_plan(12, (4, 12), (16, 64), seed=9), PLANS[1]], arms['path'])
    with pytest.raises(Inconclusive, match='different plans'): check_arms_comparable(arms['eager'], other)
    wider = replace(arms['host'], after={**arms['host'].after, 'max_batch_size': 8})
    with pytest.raises(Inconclusive, match='max_batch_size differs: eager 4, host 8'): check_arms_comparable(arms['eager'], wider)

def stretched(arm, k: float):
    "The arm as a server k times slower between tokens would have recorded its open loops."
    def slow(r): return replace(r, chunk_times=[r.chunk_times[0] + (t - r.chunk_times[0]) * k for t in r.chunk_times])
    return replace(arm, name=f'{arm.name} x{k}', opens=tuple(replace(run, records=[slow(r) for r in run.records]) for run in arm.opens))

def test_tail_not_worse(arms):
    a = arms['eager']
    check_tail_not_worse(a, a)                                                                        # an arm against itself
    with pytest.raises(Regression, match=r"eager x1.5's ITL p99 at 16.0/s is .* \(\+50%, beyond 20%\)"): check_tail_not_worse(a, stretched(a, 1.5))
    check_tail_not_worse(a, stretched(a, 1.1))                                                        # inside the tolerance
    d = ArmDelta.of(a, stretched(a, 2.0))
    assert abs(d.itl_p50_speedup - 0.5) < 1e-9 and abs(d.itl_p99_speedup - 0.5) < 1e-9 and d.itl_p99_saved_ms < 0

def test_report_lists_every_verdict_and_graph_checks_stops_at_the_first(arms):
    verdicts = dict(check_report(arms['eager'], arms['host']))
    assert len(verdicts) == 7 and verdicts['check_same_answers'] == 'pass' and verdicts['check_arm_replayed_every_step'].startswith('Inconclusive')
    with pytest.raises(Inconclusive, match='below 100%'): graph_checks(arms['eager'], arms['host'])

def test_cli_coverage(tmp_path):
    out = subprocess.run([NANOSERVE, 'bench', 'graph', '--coverage', '--csv', str(tmp_path/'c.csv')], capture_output=True, text=True, check=True).stdout
    rows = list(csv.DictReader(open(tmp_path/'c.csv')))
    assert len(rows) == 8 and 'decode steps' in out
    assert {(float(r['share']), r['scattered']) for r in rows} == {(1.0, '0')}        # the command hands coverage the persistent batch (Day 58)
    bad = subprocess.run([NANOSERVE, 'bench', 'graph', '--arms', 'eager,turbo'], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown arm(s) ['turbo']" in bad.stderr
