"""Open every page of a built site in a real browser (the system's Chromium, driven by Playwright) and list what broke.

Usage: python tools/browser_check.py SITE_DIR [SCREENSHOTS_DIR]. Exit status 1 when anything broke.
The site is served over http on 127.0.0.1, on a port the OS picks. A failure is: a console error, an uncaught
JS exception, a request that failed or answered >= 400, an internal link (<a href> inside the site) that
does not load with 200, or an image that did not load (naturalWidth 0). With SCREENSHOTS_DIR, full-page
screenshots of index.html and 57_graphbench.html are written there as index.png and 57_graphbench.png.
"""
import functools, http.server, io, shutil, sys, threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urldefrag

SCREENSHOT_PAGES = ('index.html', '57_graphbench.html')
VIEWPORT = {'width': 1280, 'height': 1100}  # tall enough that a screenshot shows the whole sidebar

def find_chromium() -> str | None:
    "The system Chromium's path (Debian's `chromium` package), or None."
    return next(filter(None, map(shutil.which, ('chromium', 'chromium-browser', 'google-chrome'))), None)

class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args): pass

@contextmanager
def serve(site: Path):
    "Serve `site` on 127.0.0.1 in a thread; yield its base URL."
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try: yield f'http://127.0.0.1:{server.server_address[1]}/'
    finally: server.shutdown(); server.server_close()

def watch(page, failures: list, name: str):
    "Record the page's console errors, uncaught exceptions, failed requests and error responses as `name: ...`."
    page.on('console', lambda m: m.type == 'error' and failures.append(f'{name}: console error: {m.text}'))
    page.on('pageerror', lambda e: failures.append(f'{name}: page error: {e}'))
    page.on('requestfailed', lambda r: failures.append(f'{name}: request failed: {r.url} ({r.failure})'))
    page.on('response', lambda r: r.status >= 400 and failures.append(f'{name}: HTTP {r.status}: {r.url}'))

BROKEN_IMAGES = "[...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute('src').slice(0, 80))"
# As the browser resolves a fragment: the id as written, else percent-decoded (nbconvert writes ids percent-encoded).
MISSING_ANCHORS = ("[...document.querySelectorAll('a[href^=\"#\"]')].filter(a => a.hash.length > 1"
                   " && !document.getElementById(a.hash.slice(1)) && !document.getElementById(decodeURIComponent(a.hash.slice(1))))"
                   ".map(a => a.getAttribute('href'))")
LINKS = "[...document.querySelectorAll('a[href]')].map(a => a.href)"

def save_png(png: bytes, path: Path):
    "Write the screenshot at `path` in 256 colours (a third of the bytes, text and plots stay sharp) where Pillow is installed."
    try: from PIL import Image
    except ImportError: return path.write_bytes(png)
    Image.open(io.BytesIO(png)).convert('RGB').quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)

def check_site(site: Path, screenshots: Path | None = None, chromium: str | None = None) -> list[str]:
    "Open every page of `site` in Chromium; return the failures (empty when all is well)."
    from playwright.sync_api import sync_playwright
    site, failures, links = Path(site), [], {}
    pages = sorted(p.name for p in site.glob('*.html'))
    if not pages: return [f'{site}: no pages to check']
    with serve(site) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium or find_chromium(), args=['--no-sandbox', '--disable-dev-shm-usage'])
        for name in pages:
            page = browser.new_page(viewport=VIEWPORT); watch(page, failures, name)
            response = page.goto(base + name, wait_until='load')
            if response is None or response.status != 200: failures.append(f'{name}: did not load ({response and response.status})')
            failures += [f'{name}: image did not load: {src}' for src in page.evaluate(BROKEN_IMAGES)]
            failures += [f'{name}: no element for the anchor {href}' for href in page.evaluate(MISSING_ANCHORS)]
            for href in page.evaluate(LINKS):
                url = urldefrag(href).url
                if url.startswith(base): links.setdefault(url, name)
            if screenshots and name in SCREENSHOT_PAGES:
                Path(screenshots).mkdir(parents=True, exist_ok=True)
                save_png(page.screenshot(full_page=True), Path(screenshots)/name.replace('.html', '.png'))
            page.close()
        if screenshots: failures += [f'{name}: no such page to screenshot' for name in SCREENSHOT_PAGES if name not in pages]
        api = p.request.new_context()
        for url, name in sorted(links.items()):
            status = api.get(url).status
            if status != 200: failures.append(f'{name}: broken link {url[len(base):]} (status {status})')
        api.dispose(); browser.close()
    return failures

if __name__ == '__main__':
    if len(sys.argv) < 2: sys.exit(__doc__)
    failures = check_site(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    print('\n'.join(failures) or f'{sys.argv[1]}: every page loaded with no errors, every link and image resolved')
    sys.exit(1 if failures else 0)
