"""The README's performance section is `python bench/performance.py`'s output, read from bench/results/latest/: the
README, the landing page and Day 24 show its headline as it is printed, the site's performance page every machine's
tables, and every file they cite is committed. Runs in about a second."""
import csv, json, runpy, shutil
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
perf = runpy.run_path(str(ROOT/'bench'/'performance.py'))

def cell(nb: str) -> str:
    cells = json.loads((ROOT/nb).read_text())['cells']
    return ''.join(next(c for c in cells if c.get('id') == perf['CELL_ID'])['source'])

def test_every_cited_file_is_committed():
    missing = [str(p.relative_to(ROOT)) for p in perf['cited_files']() if not p.is_file()]
    assert not missing, f"the performance section cites files that are not there: {missing}"
    assert (ROOT/'bench'/'results'/'latest'/'README.md').is_file()

def test_the_readme_shows_the_commands_output():
    section = perf['readme_section']((ROOT/'README.md').read_text())
    fix = 'run python bench/performance.py --write'
    assert section == perf['for_readme'](perf['render']()), f'README.md disagrees with bench/results/latest/: {fix}'
    assert '](nbs/performance.ipynb)' in section and '](nbs/performance.png)' in section

def test_the_page_shows_every_machine_and_is_on_the_site():
    assert cell(perf['PAGE']) == perf['render_page']().rstrip('\n'), 'run python bench/performance.py --write'
    assert 'performance.ipynb' in (ROOT/'nbs'/'sidebar.yml').read_text()
    assert (ROOT/perf['PLOT']).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'

def test_the_headline_is_short_and_names_each_rows_machine():
    rows = perf['headline_rows']()
    titles = {f['title'].split(',')[0] for f in perf['FAMILIES']}
    assert 0 < len(rows) <= 10 and all(r['machine'] in titles and r['lead'] > 0 for r in rows)
    assert len({(r['measure'], r['peer']) for r in rows}) == len(rows)           # no row twice
    text = perf['render']()
    assert text.count('\n| ') == len(rows) + 1 and text.count('![') == 1        # the table and one plot

@pytest.mark.parametrize('nb', perf['NOTEBOOKS'])
def test_the_notebooks_show_the_commands_output(nb):
    assert cell(nb) == perf['render']().rstrip('\n'), f'{nb} disagrees: run python bench/performance.py --write'

def test_a_changed_result_changes_the_section(tmp_path):
    "The table is read from the files, not kept beside them: one number changed in a copy shows in the output."
    latest = tmp_path/'latest'
    shutil.copytree(ROOT/'bench'/'results'/'latest', latest)
    path = latest/'zen5'/'offline.csv'
    rows = list(csv.DictReader(open(path, newline='')))
    for r in rows:
        if r['engine'].startswith('vllm'): r['output_tok_s'] = str(2 * float(r['output_tok_s']))
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert perf['render_page'](latest) != perf['render_page']()
    assert perf['render'](latest) != perf['render']()                # the headline's first row is that vLLM's

def test_one_dated_table_per_family_with_its_machine_and_ratios():
    text = perf['render_page']()
    for fam in perf['FAMILIES']:
        assert f"### {fam['title']}, {fam['date']}" in text
    assert text.count('| measure | dtype | nanoserve | peer |') == len(perf['FAMILIES'])
    assert 'torch 2.13.0+cpu' in text and 'avx512_bf16' in text and 'amx_tile' in text
    rows = [line for line in text.splitlines() if line.startswith('| ') and line.endswith('x |')]
    assert len(rows) > 10 and all(float(r.split('|')[-2].strip().rstrip('x')) > 0 for r in rows)
