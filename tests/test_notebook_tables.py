"""The notebooks' "Measured" tables that bench/notebook_tables.py prints are its output, read from the committed results
they cite: each notebook shows its table as the script prints it, every file it reads is committed, and a number changed
in a results file changes the table. Runs in well under a second."""
import csv, json, runpy, shutil
from dataclasses import replace
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
nt = runpy.run_path(str(ROOT/'bench'/'notebook_tables.py'))
FIX = 'run python bench/notebook_tables.py --write'

@pytest.mark.parametrize('t', nt['TABLES'], ids=lambda t: t.name)
def test_the_notebook_shows_the_scripts_table(t):
    assert all(f.is_file() for f in t.files), [str(f) for f in t.files if not f.is_file()]
    found = [nt['section'](c, t) for c in nt['cells'](t)]
    assert found == [nt['marked'](t)], f"{t.notebook}'s table {t.name} disagrees with {[f.name for f in t.files]}: {FIX}"

def test_a_changed_result_changes_the_table(tmp_path):
    t = next(t for t in nt['TABLES'] if t.name == 'speculative')
    copy = tmp_path/t.files[0].name
    shutil.copy(t.files[0], copy)
    rows = list(csv.DictReader(open(copy, newline='')))
    for r in rows:
        if r['arm'] == 'ngram': r['output_tok_s'] = str(2 * float(r['output_tok_s']))
    with open(copy, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert nt['marked'](replace(t, files=(copy,))) != nt['marked'](t)

def test_every_marker_names_a_table():
    "No notebook keeps a marked table the script no longer writes (it would go stale unseen)."
    names = {t.name for t in nt['TABLES']}
    for nb in sorted((ROOT/'nbs').glob('*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            src = ''.join(c['source'])
            for part in src.split('<!-- table: ')[1:]:
                assert part.split()[0] in names, f'{nb.name}: a marked table {part.split()[0]!r} the script does not know'
