"The build log renders without quarto (make preview), and the quarto configs stay valid."
import re, subprocess, sys
from pathlib import Path
import yaml

ROOT = Path(__file__).resolve().parents[1]

def test_preview_renders_every_notebook_with_working_links(tmp_path):
    subprocess.run([sys.executable, str(ROOT/'tools'/'preview.py'), str(ROOT/'nbs'), str(tmp_path)], check=True, capture_output=True)
    notebooks = sorted((ROOT/'nbs').glob('*.ipynb'))
    pages = {p.name for p in tmp_path.glob('*.html')}
    assert pages == {('index' if n.stem == 'index' else n.stem) + '.html' for n in notebooks}
    for page in tmp_path.glob('*.html'):
        text = page.read_text()
        for href in re.findall(r'<nav[^>]*>(.*?)</nav>', text, re.S)[0].split('href="')[1:]:
            assert (tmp_path/href.split('"')[0]).is_file()
    assert '<title>nanoserve: Tokenizer</title>' in (tmp_path/'02_tokenizer.html').read_text()

def test_quarto_configs_parse_and_list_existing_notebooks():
    for f in (ROOT/'_quarto.yml', ROOT/'nbs'/'_quarto.yml', ROOT/'nbs'/'nbdev.yml', ROOT/'nbs'/'sidebar.yml'):
        assert isinstance(yaml.safe_load(f.read_text()), dict), f
    def listed(items):
        for it in items:
            if isinstance(it, str): yield it
            else: yield from listed(it['contents'])
    top = yaml.safe_load((ROOT/'_quarto.yml').read_text())['website']['sidebar']['contents']
    side = yaml.safe_load((ROOT/'nbs'/'sidebar.yml').read_text())['website']['sidebar']['contents']
    assert all((ROOT/p).is_file() for p in listed(top))
    assert all((ROOT/'nbs'/p).is_file() for p in listed(side))
    assert {Path(p).name for p in listed(top)} == {p for p in listed(side)} == {p.name for p in (ROOT/'nbs').glob('*.ipynb')}
