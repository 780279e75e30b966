"""The README's sentence about its own question and the chat notebook's table are `python bench/first_answer.py --write`'s
output, read from the committed results in bench/results/first_answer/; and the script itself still runs (a short smoke run on
the default model)."""
import csv, json, runpy, shutil, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
fa = runpy.run_path(str(ROOT/'bench'/'first_answer.py'))
FIX = 'run python bench/first_answer.py --write'

def test_the_readme_and_the_landing_page_show_the_committed_results():
    want = fa['marked']()
    assert fa['section']((ROOT/'README.md').read_text()) == want, f'README.md disagrees with the results: {FIX}'
    cells = [''.join(c['source']) for c in json.loads((ROOT/'nbs'/'index.ipynb').read_text())['cells']]
    assert [fa['section'](c) for c in cells if fa['MARK'][0] in c] == [want], f'nbs/index.ipynb disagrees: {FIX}'

def test_the_chat_notebook_shows_the_committed_table():
    cells = json.loads((ROOT/fa['NOTEBOOK']).read_text())['cells']
    got = ''.join(next(c for c in cells if c.get('id') == fa['CELL_ID'])['source'])
    assert got == fa['table'](), f"{fa['NOTEBOOK']} disagrees with the results: {FIX}"

def test_the_repls_defaults_are_the_ones_measured():
    "CHAT_DEFAULTS changed without measuring them again: the sentence would name a run that did not happen."
    row = fa['pick'](*fa['REPL'], 'bare')
    assert row['variant'] == fa['repl_variant']() and int(row['seeds']) >= 200

def test_a_changed_result_changes_the_sentence(tmp_path):
    results = tmp_path/'first_answer'
    shutil.copytree(fa['RESULTS'], results)
    path = results/'chat_defaults_after.csv'
    rows = list(csv.DictReader(open(path, newline='')))
    for r in rows: r['paris'] = str(int(r['paris']) - 1)
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert fa['sentence'](results) != fa['sentence']() and fa['table'](results) != fa['table']()

def test_the_script_runs_and_counts(default_model, tmp_path):
    "Two seeds of each form in the default mode, 8 tokens each: the counts are the answers' own."
    r = subprocess.run([sys.executable, str(ROOT/'bench'/'first_answer.py'), '--name', 'smoke', '--results', str(tmp_path),
                        '--modes', 'default', '--seeds', '2', '--max-tokens', '8', '--variant', 'api',
                        '--variant', 'repetition_penalty=1.1'], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = list(csv.DictReader(open(tmp_path/'smoke.csv', newline='')))
    answers = list(csv.DictReader(open(tmp_path/'smoke_answers.csv', newline='')))
    assert [(s['variant'], s['form']) for s in summary] == [(v, f) for v in ('api', 'repetition_penalty=1.1') for f in fa['FORMS']]
    assert len(answers) == 8
    for s in summary:
        mine = [a for a in answers if (a['variant'], a['form']) == (s['variant'], s['form'])]
        assert int(s['paris']) == sum('Paris' in a['text'] for a in mine)
        assert int(s['length']) == sum(a['finish'] == 'length' for a in mine)

def test_a_loop_is_a_run_of_tokens_repeated():
    repeats = fa['repeats']
    assert repeats([1, 2, 3, 4] * 5) and not repeats([1, 2, 3, 4] * 4) and not repeats(list(range(100)))
