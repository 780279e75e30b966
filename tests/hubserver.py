"""A local server that speaks the part of the Hugging Face Hub's HTTP API that `huggingface_hub` uses to download a
model: the repo info and tree listings under /api/models/, and files under /{repo}/resolve/{revision}/{path} (HEAD and
GET, with Range), with the Hub's error headers (X-Error-Code: RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo). Point HF_ENDPOINT at it. Every request is recorded, so a test can say what was fetched; a file can be cut
off once after N bytes, to check that a download resumes, or stalled there, to kill the client mid-file."""
from __future__ import annotations
import hashlib, json, re, threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

@dataclass
class Repo:
    commits: dict[str, Path]                      # commit sha (40 hex) -> the directory holding that commit's files
    refs: dict[str, str]                          # branch or tag -> commit sha
    gated: bool = False                           # files need the hub's token

@dataclass
class Seen:
    method: str
    path: str                                     # the URL path, unquoted
    range: str | None                             # the Range header, if any
    token: str | None                             # the bearer token, if any

def commit_sha(name: str) -> str: return hashlib.sha1(name.encode()).hexdigest()

@dataclass
class LocalHub:
    token: str = 'hf_local_test_token'            # the token a gated repo wants
    repos: dict[str, Repo] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    cut: dict[str, int] = field(default_factory=dict)    # file name -> bytes sent before the connection is cut, once
    # file name -> (bytes sent, an event set once they are, an event that lets the handler close the connection), once
    stall: dict[str, tuple] = field(default_factory=dict)
    list_refused: bool = False                    # the tree API answers 500 (a Hub that lists nothing)

    def add(self, repo_id: str, path: Path, revision: str = 'main', gated: bool = False) -> str:
        "Serve directory `path` as `revision` of `repo_id`; returns the commit sha."
        sha = commit_sha(f'{repo_id}@{revision}')
        repo = self.repos.setdefault(repo_id, Repo({}, {}, gated))
        repo.commits[sha] = Path(path)
        repo.refs[revision] = sha
        return sha

    def start(self) -> str:
        hub = self
        class Handler(Quiet):
            def do_HEAD(self): hub.answer(self, body=False)
            def do_GET(self): hub.answer(self, body=True)
        self.server = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None     # a client that hangs up is not the server's error
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f'http://127.0.0.1:{self.server.server_address[1]}'

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def answer(self, h: BaseHTTPRequestHandler, body: bool):
        url = urlsplit(h.path)
        path = unquote(url.path)
        auth = h.headers.get('Authorization', '')
        token = auth.removeprefix('Bearer ') if auth.startswith('Bearer ') else None
        self.seen.append(Seen(h.command, path, h.headers.get('Range'), token))
        if m := re.fullmatch(r'/api/models/([^/]+/[^/]+)/revision/(.+)', path):
            return self.repo_info(h, m[1], m[2], body)
        if m := re.fullmatch(r'/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?', path):
            return self.tree(h, m[1], m[2], body)
        if m := re.fullmatch(r'/([^/]+/[^/]+)/resolve/([^/]+)/(.+)', path):
            return self.resolve(h, m[1], m[2], m[3], body, token)
        error(h, 404, 'RepoNotFound', f'no route {path}', body)

    def find(self, h, repo_id: str, revision: str, body: bool) -> tuple[Repo, str, Path] | None:
        repo = self.repos.get(repo_id)
        if repo is None: return error(h, 404, 'RepoNotFound', f'Repository {repo_id} not found', body)
        sha = revision if revision in repo.commits else repo.refs.get(revision)
        if sha is None: return error(h, 404, 'RevisionNotFound', f'Invalid rev id: {revision}', body)
        return repo, sha, repo.commits[sha]

    def repo_info(self, h, repo_id, revision, body):
        if (found := self.find(h, repo_id, revision, body)) is None: return
        repo, sha, root = found
        files = sorted(str(p.relative_to(root)) for p in root.rglob('*') if p.is_file())
        send_json(h, {'id': repo_id, 'sha': sha, 'private': False, 'gated': 'manual' if repo.gated else False,
                      'siblings': [{'rfilename': f} for f in files]}, body)

    def tree(self, h, repo_id, revision, body):
        if self.list_refused: return error(h, 500, None, 'the tree listing is down', body)
        if (found := self.find(h, repo_id, revision, body)) is None: return
        _, _, root = found
        out = []
        for p in sorted(root.rglob('*')):
            if not p.is_file(): continue
            entry = {'type': 'file', 'path': str(p.relative_to(root)), 'size': p.stat().st_size, 'oid': git_oid(p)}
            if p.suffix == '.safetensors':
                entry['lfs'] = {'oid': sha256(p), 'size': p.stat().st_size, 'pointerSize': 134}
            out.append(entry)
        send_json(h, out, body)

    def resolve(self, h, repo_id, revision, name, body, token):
        if (found := self.find(h, repo_id, revision, body)) is None: return
        repo, sha, root = found
        if repo.gated and token != self.token:
            return error(h, 401, 'GatedRepo', f'Access to model {repo_id} is restricted. You must have access to it '
                         'and be authenticated to access it. Please log in.', body)
        f = root/name
        if not f.is_file(): return error(h, 404, 'EntryNotFound', f'{name} does not exist on "{revision}"', body)
        data = f.read_bytes()
        start = 0
        if (r := h.headers.get('Range')) and (m := re.fullmatch(r'bytes=(\d+)-(\d*)', r)): start = int(m[1])
        h.send_response(206 if start else 200)
        h.send_header('X-Repo-Commit', sha)
        h.send_header('ETag', f'"{sha256(f) if f.suffix == ".safetensors" else git_oid(f)}"')
        if f.suffix == '.safetensors':
            h.send_header('X-Linked-Etag', f'"{sha256(f)}"')
            h.send_header('X-Linked-Size', str(len(data)))
        if start: h.send_header('Content-Range', f'bytes {start}-{len(data) - 1}/{len(data)}')
        h.send_header('Accept-Ranges', 'bytes')
        h.send_header('Content-Length', str(len(data) - start))
        h.end_headers()
        if not body: return
        cut = self.cut.pop(name, None) if not start else None
        stall = self.stall.pop(name, None) if not start else None
        if cut is not None or stall is not None:
            h.wfile.write(data[:cut if stall is None else stall[0]])
            h.wfile.flush()
            if stall is not None:
                stall[1].set()
                stall[2].wait(300)
            h.close_connection = True
            h.connection.shutdown(2)                # mid-body: the client reads a short body
            return
        h.wfile.write(data[start:])

class Quiet(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass

def send_json(h, obj, body: bool):
    data = json.dumps(obj).encode()
    h.send_response(200)
    h.send_header('Content-Type', 'application/json')
    h.send_header('Content-Length', str(len(data)))
    h.end_headers()
    if body: h.wfile.write(data)

def error(h, status: int, code: str | None, message: str, body: bool):
    data = json.dumps({'error': message}).encode()
    h.send_response(status)
    if code: h.send_header('X-Error-Code', code)
    h.send_header('X-Error-Message', message)
    h.send_header('Content-Type', 'application/json')
    h.send_header('Content-Length', str(len(data)))
    h.end_headers()
    if body: h.wfile.write(data)

def sha256(p: Path) -> str: return hashlib.sha256(p.read_bytes()).hexdigest()

def git_oid(p: Path) -> str:
    data = p.read_bytes()
    return hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()
