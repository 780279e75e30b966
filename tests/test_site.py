"""The build log renders without quarto (make site / make preview: tools/preview.py), and the quarto configs stay valid.

The rendered site is checked as files here (every notebook has a page, every link and image resolves, the sidebar
follows nbs/sidebar.yml); tests/test_browser.py opens the same pages in a real browser."""
import re, shutil, subprocess, sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit
import pytest, yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'tools'))
from preview import page_name, page_order, sections

@pytest.fixture(scope='module')
def site(tmp_path_factory) -> Path:
    "The notebooks rendered once by tools/preview.py, as `make site` does without quarto."
    out = tmp_path_factory.mktemp('site')
    subprocess.run([sys.executable, str(ROOT/'tools'/'preview.py'), str(ROOT/'nbs'), str(out)], check=True, capture_output=True)
    return out

class Refs(HTMLParser):
    "What one page points at: <a href>s, <img src>s, <script src>s and <link href>s, and the ids it defines."
    def __init__(self, text: str):
        super().__init__(); self.hrefs, self.imgs, self.loads, self.ids = [], [], [], set()
        self.feed(text)
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if 'id' in a: self.ids.add(a['id'])
        if tag == 'a' and 'href' in a: self.hrefs.append(a['href'])
        if tag == 'img': self.imgs.append(a.get('src', ''))
        if tag == 'script' and 'src' in a: self.loads.append(a['src'])
        if tag == 'link' and 'href' in a: self.loads.append(a['href'])

def has_id(refs: Refs, fragment: str) -> bool:
    "The browser's rule: the fragment names an id as written, or percent-decoded (nbconvert writes ids percent-encoded)."
    return not fragment or fragment in refs.ids or unquote(fragment) in refs.ids

def site_problems(site: Path) -> list[str]:
    "Every internal href, <img src> and loaded resource of every page that does not resolve inside `site`."
    refs = {p.name: Refs(p.read_text(encoding='utf-8')) for p in site.glob('*.html')}
    problems = []
    for name, r in sorted(refs.items()):
        for href in r.hrefs:
            u = urlsplit(href)
            if u.scheme or u.netloc: continue                              # an external link: not loaded to show the page
            target = u.path or name
            if not (site/target).is_file(): problems.append(f'{name}: link to a missing file {href}')
            elif target in refs and not has_id(refs[target], u.fragment): problems.append(f'{name}: link to a missing anchor {href}')
        for src in r.imgs:
            if not (src.startswith('data:') or (src and (site/urlsplit(src).path).is_file())): problems.append(f'{name}: image not found {src[:60]}')
        for src in r.loads:
            if not (src.startswith('data:') or (site/src).is_file()): problems.append(f'{name}: loads something outside the site {src}')
    return problems

def test_every_notebook_has_a_page(site):
    notebooks = sorted((ROOT/'nbs').glob('*.ipynb'))
    assert {p.name for p in site.glob('*.html')} == {page_name(n) for n in notebooks}
    assert (site/'index.html').is_file() and (site/'site.css').is_file()
    assert '<title>nanoserve: Tokenizer</title>' in (site/'02_tokenizer.html').read_text()

def test_home_page_links_every_page(site):
    assert {p.name for p in site.glob('*.html')} <= set(Refs((site/'index.html').read_text()).hrefs)

def test_every_link_image_and_resource_resolves(site):
    assert site_problems(site) == []
    assert sum(len(Refs(p.read_text()).imgs) for p in site.glob('*.html')) > 10    # output plots and markdown images, all embedded

def test_markdown_images_beside_the_notebook_are_embedded(site):
    "`![](graphbench.png)` in nbs/ and `![](../bench/results/graphbench.png)` outside it both become data: URIs."
    imgs = Refs((site/'57_graphbench.html').read_text()).imgs
    assert imgs and all(src.startswith('data:image/png;base64,') for src in imgs)

def test_sidebar_follows_sidebar_yml(site):
    "Section headings in sidebar.yml's order, a link per notebook in page order, the current page marked, prev/next in the same order."
    side = yaml.safe_load((ROOT/'nbs'/'sidebar.yml').read_text())['website']['sidebar']['contents']
    titles = [it['section'] for it in side if isinstance(it, dict)]
    assert [t for t, _ in sections(ROOT/'nbs') if t and t != 'Other'] == titles
    order = [page_name(p) for p in page_order(ROOT/'nbs')]
    assert order[0] == 'index.html'
    for i, name in enumerate(order):
        text = (site/name).read_text()
        nav = re.search(r'<nav class="sidebar".*?</nav>', text, re.S).group(0)
        headings = re.findall(r'<h2>(.*?)</h2>', nav)
        assert headings[:len(titles)] == titles, name
        assert re.findall(r'<li><a href="([^"]+)"', nav) == order, name
        assert re.findall(r'<a href="([^"]+)" class="current" aria-current="page"', nav) == [name]
        pager = re.search(r'<nav class="pager".*?</nav>', text, re.S).group(0)
        assert re.findall(r'rel="prev" href="([^"]+)"', pager) == order[max(i-1, 0):i]
        assert re.findall(r'rel="next" href="([^"]+)"', pager) == order[i+1:i+2]

def test_the_file_check_finds_what_it_guards(site, tmp_path):
    "A copy of the site with a broken link, a missing anchor, a missing image and a CDN script: each one is reported."
    broken = tmp_path/'broken'; shutil.copytree(site, broken)
    page = broken/'02_tokenizer.html'
    text = page.read_text().replace('</main>', '<a href="gone.html">x</a><a href="index.html#nowhere">y</a><img src="missing.png">'
                                    '<script src="https://cdn.example.invalid/require.js"></script></main>')
    page.write_text(text); (broken/'03_weights.html').unlink()
    found = site_problems(broken)
    for expected in ('link to a missing file gone.html', 'link to a missing anchor index.html#nowhere', 'image not found missing.png',
                     'loads something outside the site https://cdn.example.invalid/require.js', 'link to a missing file 03_weights.html'):
        assert any(expected in f for f in found), (expected, found)

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
