"""Render the notebooks to a browsable static site where quarto is not available.

Usage: python tools/preview.py [NBS_DIR] [OUT_DIR]. One page per notebook (index.html for index.ipynb,
<stem>.html for the rest), a left sidebar grouped like nbs/sidebar.yml's sections, prev/next links in the
same order, and one stylesheet, site.css. The notebooks are not executed: their saved outputs are shown.

Every page displays offline. nbconvert's `lab` template loads require.js and MathJax from a CDN; the `basic`
template gives the cells alone and we wrap them in our own page, which loads only site.css. Output images
are data: URIs already; the files a markdown cell shows (`![](loadreport.png)`, `![](../bench/results/x.png)`)
become data: URIs too (nbconvert's `embed_images` refuses paths outside nbs/). Links to `x.ipynb` go to x.html,
as in quarto's render. Widget views are dropped: they need a widget manager (and jQuery) a static page lacks.
"""
import base64, copy, html, mimetypes, re, sys
from pathlib import Path
import nbformat, yaml
from nbconvert import HTMLExporter
from pygments.formatters import HtmlFormatter

def sections(nbs: Path) -> list[tuple[str, list[Path]]]:
    "sidebar.yml as (section title, notebooks) in order, '' for entries outside a section; unlisted notebooks last, as 'Other'."
    groups, seen = [], set()
    def walk(items, title):
        for it in items:
            if isinstance(it, dict): walk(it.get('contents', []), it.get('section', title)); continue
            p = nbs/it
            if not p.is_file() or p in seen: continue
            if not groups or groups[-1][0] != title: groups.append((title, []))
            groups[-1][1].append(p); seen.add(p)
    side = nbs/'sidebar.yml'
    if side.is_file(): walk(yaml.safe_load(side.read_text())['website']['sidebar']['contents'], '')
    rest = sorted(p for p in nbs.glob('*.ipynb') if p not in seen)
    return groups + ([('Other', rest)] if rest else [])

def page_order(nbs: Path) -> list[Path]:
    "Notebooks in sidebar order, then any others, sorted."
    return [p for _, ps in sections(nbs) for p in ps]

def page_name(nb_path: Path) -> str:
    "The page a notebook becomes: index.html for index.ipynb, <stem>.html for the others."
    return 'index.html' if nb_path.stem == 'index' else f'{nb_path.stem}.html'

def title_of(nb) -> tuple[str, str]:
    "The notebook's '# Title' and '> summary' lines."
    src = next((c.source for c in nb.cells if c.cell_type == 'markdown'), '')
    t = re.search(r'^#\s+(.+)$', src, re.M); s = re.search(r'^>\s*(.+)$', src, re.M)
    return (t.group(1).strip() if t else 'untitled', s.group(1).strip() if s else '')

def shown(nb):
    "The notebook as nbdev's docs show it: `#| hide` cells dropped, `#|` directive lines out of the code."
    nb = copy.deepcopy(nb)
    nb.metadata.pop('widgets', None)
    nb.cells = [c for c in nb.cells if not re.search(r'^#\|\s*(hide\s*$|include:\s*false)', c.source, re.M)]
    for c in nb.cells:
        if c.cell_type != 'code': continue
        c.source = re.sub(r'^#\|.*(\n|$)', '', c.source, flags=re.M)
        for o in c.outputs: o.get('data', {}).pop('application/vnd.jupyter.widget-view+json', None)
        c.outputs = [o for o in c.outputs if o.get('data', True)]
    nb.cells = [c for c in nb.cells if c.source.strip() or c.get('outputs')]
    return nb

def inline_images(body: str, base: Path) -> str:
    "Each <img src> that names a file (relative to `base`, the notebook's folder) as a data: URI."
    def data_uri(m):
        f = base/html.unescape(m.group(2))
        if m.group(2).startswith(('data:', 'http:', 'https:')) or not f.is_file(): return m.group(0)
        mime = mimetypes.guess_type(f.name)[0] or 'application/octet-stream'
        return f'{m.group(1)}data:{mime};base64,{base64.b64encode(f.read_bytes()).decode()}"'
    return re.sub(r'(<img\b[^>]*?\bsrc=")([^"]+)"', data_uri, body)

def link_pages(body: str) -> str:
    "Links between notebooks (`[Day 6](06_fast.ipynb)`) point at their pages, as quarto's render does."
    return re.sub(r'(<a\b[^>]*?\bhref=")([^"#/:]+)\.ipynb(#[^"]*)?"', lambda m: f'{m[1]}{page_name(Path(m[2]))}{m[3] or ""}"', body)

def title_html(title: str) -> str:
    "A title for a link: escaped, its `code` spans as <code>."
    return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(title))

def sidebar(groups, titles: dict, current: Path) -> str:
    "The left sidebar: a heading per section, a link per notebook, the current page marked."
    out = ['<nav class="sidebar" aria-label="Build log"><a class="site-title" href="index.html">nanoserve build log</a>']
    for section, ps in groups:
        if section: out.append(f'<h2>{html.escape(section)}</h2>')
        items = []
        for p in ps:
            mark = ' class="current" aria-current="page"' if p == current else ''
            items.append(f'<li><a href="{page_name(p)}"{mark}>{title_html(titles[p])}</a></li>')
        out.append(f'<ul>{"".join(items)}</ul>')
    return '\n'.join(out) + '</nav>'

def pager(order: list[Path], titles: dict, i: int) -> str:
    "Links to the previous and next pages in sidebar order."
    links = []
    if i > 0: links.append(f'<a class="prev" rel="prev" href="{page_name(order[i-1])}">&larr; {title_html(titles[order[i-1]])}</a>')
    if i + 1 < len(order): links.append(f'<a class="next" rel="next" href="{page_name(order[i+1])}">{title_html(titles[order[i+1]])} &rarr;</a>')
    return f'<nav class="pager" aria-label="Previous and next">{"".join(links)}</nav>'

PAGE = '''<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>nanoserve: {title}</title><meta name="description" content="{summary}">
<link rel="icon" href="data:,"><link rel="stylesheet" href="site.css"></head>
<body>
{sidebar}
<main>
{body}
{pager}
</main></body></html>
'''

CSS = '''/* nanoserve build log: one stylesheet for every page (tools/preview.py writes it). */
:root { --side: 17rem; --fg: #1d232a; --muted: #5b6570; --line: #d5dbe1; --code-bg: #f5f7f9; --accent: #0b5fbf; }
* { box-sizing: border-box; }
body { margin: 0; display: grid; grid-template-columns: var(--side) minmax(0, 1fr); color: var(--fg);
  font: 16px/1.6 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.sidebar { position: sticky; top: 0; height: 100vh; overflow-y: auto; padding: .8rem 1rem; font-size: .85rem; line-height: 1.35;
  background: #f8f9fb; border-right: 1px solid var(--line); }
.sidebar .site-title { display: block; font-size: 1.2rem; font-weight: 700; color: var(--fg); text-decoration: none; }
.sidebar h2 { margin: .9rem 0 .25rem; font-size: .72rem; letter-spacing: .05em; text-transform: uppercase; color: var(--muted); }
.sidebar ul { list-style: none; margin: 0; padding: 0; }
.sidebar li a { display: block; padding: .1rem .5rem; border-radius: 4px; color: var(--fg); text-decoration: none; }
.sidebar li a:hover { background: #e9edf1; }
.sidebar li a.current { background: var(--accent); color: #fff; font-weight: 600; }
main { min-width: 0; max-width: 58rem; padding: 1.5rem 2.5rem 3rem; }
p, li, blockquote { max-width: 46rem; }
a { color: var(--accent); }
h1, h2, h3, h4 { line-height: 1.25; margin: 1.6em 0 .5em; } h1 { margin-top: 0; font-size: 2rem; }
a.anchor-link { margin-left: .3em; color: var(--muted); text-decoration: none; visibility: hidden; }
:is(h1, h2, h3, h4):hover a.anchor-link { visibility: visible; }
blockquote { margin: 1rem 0; padding: .1rem 1rem; border-left: 4px solid var(--line); color: var(--muted); }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .86rem; }
code { padding: .1em .3em; border-radius: 3px; background: var(--code-bg); }
pre { margin: .6rem 0; padding: .7rem 1rem; overflow-x: auto; line-height: 1.45; border-radius: 6px; background: var(--code-bg); }
pre code { padding: 0; background: none; }
.highlight { background: none; } .input_area pre { border-left: 3px solid var(--accent); }
.output_area pre { background: #fff; border: 1px solid var(--line); } .output_stderr pre { background: #fff6f6; }
table { display: block; max-width: 100%; overflow-x: auto; margin: 1rem 0; border-collapse: collapse; font-size: .9rem; }
th, td { padding: .35rem .7rem; border: 1px solid var(--line); text-align: left; vertical-align: top; }
thead th { background: #e9edf1; } tbody tr:nth-child(even) { background: #f6f8fa; }
img { max-width: 100%; height: auto; }
.pager { display: flex; gap: 1rem; margin-top: 3rem; padding-top: 1rem; border-top: 1px solid var(--line); }
.pager .next { margin-left: auto; text-align: right; }
@media (max-width: 50rem) { body { display: block; } main { padding: 1rem; }
  .sidebar { position: static; height: auto; border-right: 0; border-bottom: 1px solid var(--line); } }
'''

def build(nbs: Path, out: Path) -> list[Path]:
    "Write a page per notebook, and site.css, into `out`; return the pages written."
    out.mkdir(parents=True, exist_ok=True)
    (out/'site.css').write_text(HtmlFormatter(style='default').get_style_defs('.highlight') + '\n' + CSS, encoding='utf-8')
    groups = sections(nbs)
    order = [p for _, ps in groups for p in ps]
    nbs_read = {p: nbformat.read(p, as_version=4) for p in order}
    titles = {p: title_of(nb)[0] for p, nb in nbs_read.items()}
    exporter = HTMLExporter(template_name='basic', exclude_input_prompt=True, exclude_output_prompt=True)
    written = []
    for i, p in enumerate(order):
        body = link_pages(inline_images(exporter.from_notebook_node(shown(nbs_read[p]))[0], p.parent))
        title, summary = title_of(nbs_read[p])
        page = PAGE.format(title=html.escape(title.replace('`', '')), summary=html.escape(summary), sidebar=sidebar(groups, titles, p),
                           body=body, pager=pager(order, titles, i))
        f = out/page_name(p)
        f.write_text(page, encoding='utf-8'); written.append(f)
    return written

if __name__ == '__main__':
    nbs, out = Path(sys.argv[1] if len(sys.argv) > 1 else 'nbs'), Path(sys.argv[2] if len(sys.argv) > 2 else '_site')
    for f in build(nbs, out): print(f)
