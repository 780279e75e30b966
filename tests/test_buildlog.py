"The build log reads as one: every day says where it sits and what it adds, ends with what I learned and what comes next, and the pictures the prose promises are saved in the notebooks, so the site shows them without running anything."
import json, re
from pathlib import Path
import pytest

NBS = Path(__file__).resolve().parents[1]/'nbs'
DAYS = sorted(p for p in NBS.glob('[0-9]*.ipynb'))
# notebook -> what its saved figure shows (the pictures a reader of that day needs)
FIGURES = {'00_figures': 'boxes, arrows and cells; the request path', '10_kvcache': 'the block pool, block tables and slot table',
           '16_scheduler': 'a scheduler trace over time', '18_runner': 'the flat batch of a mixed step', '20_engine': 'the engine loop',
           '30_async': 'the async bridge', '52_buckets': 'the bucket grid', '54_capture': 'the capture decision flow',
           '56_launch': 'the boot order', '57_graphbench': 'the replay row window'}
DAY_LINE = re.compile(r'^\*(Day \d+|Not a day: [^·]+) · Phase \d: [^·]+ · week \d+\. Adds: .+\.\*$')

def markdown(p: Path) -> list[str]: return [''.join(c['source']) for c in json.loads(p.read_text())['cells'] if c['cell_type'] == 'markdown']

@pytest.mark.parametrize('nb', DAYS, ids=lambda p: p.stem)
def test_each_day_says_where_it_sits_what_it_learned_and_what_is_next(nb):
    md = markdown(nb)
    assert md[0].startswith('# ') and re.search(r'^> ', md[0], re.M), 'a title and a one-line summary first'
    assert DAY_LINE.match(md[1]), f'the second cell is the day line (day, phase, week, what it adds), got {md[1][:80]!r}'
    assert any(re.search(r'^## What I learned$', m, re.M) for m in md)
    nxt = [m for m in md if re.search(r'^## Next$', m, re.M)]
    assert nxt, 'a Next section'
    for target in re.findall(r'\]\(([^)]+\.ipynb)\)', nxt[-1]): assert (NBS/target).is_file(), target

@pytest.mark.parametrize('name', FIGURES)
def test_the_listed_diagrams_are_saved_outputs(name):
    cells = json.loads((NBS/f'{name}.ipynb').read_text())['cells']
    assert any('image/png' in o.get('data', {}) for c in cells if c['cell_type'] == 'code' for o in c.get('outputs', [])), \
        f"{name} has no saved figure ({FIGURES[name]}): run the notebook and save it with its outputs"

def test_the_landing_page_draws_the_request_path_and_lists_every_day_by_phase():
    md = '\n'.join(markdown(NBS/'index.ipynb'))
    for img in re.findall(r'!\[[^\]]*\]\(([^)]+)\)', md): assert (NBS/img).is_file(), img
    assert 'request_path.png' in md
    phases = re.findall(r'^### (Phase \d: .+)$', md, re.M)
    assert phases == ['Phase 1: the model', 'Phase 2: the engine', 'Phase 3: serving', 'Phase 4: benchmark and optimize']
    linked = set(re.findall(r'\]\((\d\d_\w+)\.ipynb\)', md))
    assert linked == {p.stem for p in DAYS}
