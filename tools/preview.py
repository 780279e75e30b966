"""Render the notebooks to a browsable local HTML site where quarto is not available.

Usage: python tools/preview.py [NBS_DIR] [OUT_DIR]. Pages follow nbs/sidebar.yml's order; each gets a navigation bar.
The notebooks are not executed: their saved outputs (tables, plots) are shown as committed.
"""
import html, re, sys
from pathlib import Path
import nbformat, yaml
from nbconvert import HTMLExporter

def page_order(nbs: Path) -> list[Path]:
    "Notebooks in sidebar.yml order, then any others, sorted."
    listed = []
    def walk(items):
        for it in items:
            if isinstance(it, str): listed.append(nbs/it)
            elif isinstance(it, dict): walk(it.get('contents', []))
    side = nbs/'sidebar.yml'
    if side.is_file(): walk(yaml.safe_load(side.read_text())['website']['sidebar']['contents'])
    rest = sorted(p for p in nbs.glob('*.ipynb') if p not in listed)
    return [p for p in listed if p.is_file()] + rest

def title_of(nb) -> tuple[str, str]:
    "The notebook's '# Title' and '> summary' lines."
    src = next((c.source for c in nb.cells if c.cell_type == 'markdown'), '')
    t = re.search(r'^#\s+(.+)$', src, re.M); s = re.search(r'^>\s*(.+)$', src, re.M)
    return (t.group(1).strip() if t else 'untitled', s.group(1).strip() if s else '')

def build(nbs: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    pages = [(p, nbformat.read(p, as_version=4)) for p in page_order(nbs)]
    nav = ' | '.join(f'<a href="{"index" if p.stem == "index" else p.stem}.html">{html.escape(title_of(nb)[0])}</a>' for p, nb in pages)
    exporter, written = HTMLExporter(template_name='lab'), []
    for p, nb in pages:
        body, _ = exporter.from_notebook_node(nb)
        title, summary = title_of(nb)
        bar = f'<nav style="padding:.6em 1em;border-bottom:1px solid #ccc;font-family:sans-serif">{nav}</nav>'
        body = body.replace('<body', '<body data-nanoserve-page="1"', 1)
        body = re.sub(r'(<body[^>]*>)', lambda m: m.group(1) + bar, body, count=1)
        body = re.sub(r'<title>.*?</title>', f'<title>nanoserve: {html.escape(title)}</title>', body, count=1, flags=re.S)
        f = out/('index.html' if p.stem == 'index' else f'{p.stem}.html')
        f.write_text(body, encoding='utf-8'); written.append(f)
    return written

if __name__ == '__main__':
    nbs, out = Path(sys.argv[1] if len(sys.argv) > 1 else 'nbs'), Path(sys.argv[2] if len(sys.argv) > 2 else '_site')
    for f in build(nbs, out): print(f)
