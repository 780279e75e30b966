"""The build log in a real browser: Debian's Chromium, driven by Playwright, opens every page that tools/preview.py renders
(served over http on 127.0.0.1) and finds no console error, uncaught exception, failed request, broken link or image.
Skips, naming what is missing, where chromium (apt-get install chromium; `make test` installs it as root) or playwright is not there."""
import subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'tools'))
from browser_check import check_site, find_chromium

@pytest.fixture(scope='module')
def chromium() -> str:
    "The system Chromium's path; skips the module's tests when it or playwright is missing."
    try: import playwright.sync_api  # noqa: F401
    except ImportError as e: pytest.skip(f'playwright cannot be imported ({e}); it is in the test extras: pip install -e ".[test]"')
    path = find_chromium()
    if path is None: pytest.skip('no chromium on PATH (Debian: apt-get install -y chromium; `make test` installs it when run as root)')
    return path

def test_every_page_loads_cleanly_in_chromium(chromium, tmp_path):
    site, shots = tmp_path/'site', tmp_path/'shots'
    subprocess.run([sys.executable, str(ROOT/'tools'/'preview.py'), str(ROOT/'nbs'), str(site)], check=True, capture_output=True)
    assert check_site(site, shots, chromium) == []
    for png in ('index.png', '57_graphbench.png'):
        head = (shots/png).read_bytes()[:24]
        assert head[:8] == b'\x89PNG\r\n\x1a\n' and int.from_bytes(head[16:20], 'big') == 1280, png   # a PNG, 1280 wide

HEAD = '<!DOCTYPE html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>t</title></head>'
DOT = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII='
BROKEN_SITE = {
    'index.html': HEAD + '<body><a href="ok.html">ok</a><a href="gone.html">gone</a><a href="#nowhere">anchor</a><img src="missing.png">'
                  '<script>console.error("boom")</script><script>notDefined()</script>'
                  '<script src="https://cdn.example.invalid/require.min.js"></script></body></html>',
    'ok.html': HEAD + f'<body><h1 id="top">fine</h1><a href="#top">top</a><a href="index.html">home</a><img src="{DOT}"></body></html>',
}

def test_the_check_finds_what_it_guards(chromium, tmp_path):
    "A tiny site with one of each failure: each is reported, against the page it is on, and the clean page reports nothing."
    for name, text in BROKEN_SITE.items(): (tmp_path/name).write_text(text)
    found = check_site(tmp_path, chromium=chromium)
    expected = ['index.html: broken link gone.html (status 404)', 'index.html: no element for the anchor #nowhere',
                'index.html: image did not load: missing.png', 'index.html: console error: boom',
                'index.html: page error: notDefined is not defined', 'index.html: request failed: https://cdn.example.invalid/require.min.js',
                'index.html: HTTP 404: ']
    for e in expected: assert any(f.startswith(e) for f in found), (e, found)
    assert not [f for f in found if f.startswith('ok.html')]
