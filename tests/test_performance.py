"""The README's performance section is `python bench/performance.py`'s output, read from bench/results/latest/: the
README, the landing page and Day 24 show it as it is printed, and every file it cites is committed. Runs in well under a
second."""
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
    assert section == perf['render'](), f'README.md disagrees with bench/results/latest/: {fix}'

@pytest.mark.parametrize('nb', perf['NOTEBOOKS'])
def test_the_notebooks_show_the_commands_output(nb):
    assert cell(nb) == perf['render']().rstrip('\n'), f'{nb} disagrees: run python bench/performance.py --write'

def test_a_changed_result_changes_the_section(tmp_path):
    "The table is read from the files, not kept beside them: one number changed in a copy shows in the output."
    latest = tmp_path/'latest'
    shutil.copytree(ROOT/'bench'/'results'/'latest', latest)
    path = latest/'zen4'/'offline.csv'
    rows = list(csv.DictReader(open(path, newline='')))
    for r in rows:
        if r['engine'].startswith('vllm'): r['output_tok_s'] = str(2 * float(r['output_tok_s']))
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert perf['render'](latest) != perf['render']()

def test_one_dated_table_per_family_with_its_machine_and_ratios():
    text = perf['render']()
    for fam in perf['FAMILIES']:
        assert f"### {fam['title']}, {fam['date']}" in text
    assert text.count('| measure | dtype | nanoserve | peer |') == len(perf['FAMILIES'])
    assert 'torch 2.13.0+cpu' in text and 'avx512_bf16' in text and 'amx_tile' in text
    rows = [line for line in text.splitlines() if line.startswith('| ') and line.endswith('x |')]
    assert len(rows) > 10 and all(float(r.split('|')[-2].strip().rstrip('x')) > 0 for r in rows)
