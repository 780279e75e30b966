"""Record what a server answers to a fixed set of schemathesis-generated requests, to compare two versions of nanoserve.

    python tools/fuzz_record.py --tree DIR --cases cases.json --out answers.jsonl [--examples 300]
    python tools/fuzz_record.py --compare before.jsonl after.jsonl

starts `DIR/.venv/bin/nanoserve serve` on a tiny random checkpoint (as tests/test_fuzz.py does) and sends it the
cases in `cases.json`: made once from the API's OpenAPI schema by schemathesis (`--examples` a route) when the file does
not exist, then replayed as they are, so two versions answer the very same requests. It writes one line a case: the
request, the status, and the error message, or for a success its deterministic part (the text of a seeded or greedy
answer, never ids or times).
`--compare A B` prints how two such files differ, grouped by route, status and message."""
import argparse, json, sys, tempfile
from pathlib import Path

def make_cases(examples: int) -> list:
    "[method, path, body] for every case schemathesis generates, three in four naming the served model."
    import schemathesis
    from hypothesis import given, settings, HealthCheck, Phase
    from nanoserve.server import openapi_schema
    schema = schemathesis.openapi.from_dict(openapi_schema())
    out = []
    for result in schema.get_all_operations():
        @given(result.ok().as_strategy())
        @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def collect(case): out.append(case)
        collect()
    made = []
    for k, case in enumerate(out):
        body = case.body if isinstance(case.body, (dict, list, str, int, float, bool)) else None
        if isinstance(body, dict) and 'model' in body and k % 4: body['model'] = 'tiny'
        if isinstance(body, dict) and isinstance(body.get('max_tokens'), int):
            body['max_tokens'] = min(body['max_tokens'], 8)
        made.append([case.method, case.path, body])
    return made

def stable(path: str, asked, body) -> object:
    "The part of a successful answer to `asked` that does not change between runs."
    if not isinstance(body, dict): return None
    if path in ('/tokenize', '/detokenize'): return body
    if 'choices' not in body: return sorted(body)
    fixed = asked.get('seed') is not None or asked.get('temperature') == 0     # else the text is a fresh draw each run
    keys = ('index', 'text', 'message', 'finish_reason') if fixed else ('index',)
    return [{k: c.get(k) for k in keys} for c in body['choices']]

def record(tree: Path, cases: Path, out: Path, examples: int):
    import httpx
    from nanoserve.loadgen import spawn_server
    sys.path.insert(0, str(Path(__file__).parents[1]/'tests'))
    from conftest import make_tiny
    if not cases.exists(): cases.write_text(json.dumps(make_cases(examples)))
    todo = json.loads(cases.read_text())
    ckpt = make_tiny(Path(tempfile.mkdtemp()), 'llama_tied_gqa')
    flags = ['--served-model-name', 'tiny', '--max-model-len', '64', '--max-batch-size', '4',
             '--max-tokens-default', '4', '--dtype', 'float32', '--port', '0']
    command = [str(tree/'.venv/bin/nanoserve'), 'serve', '--model', str(ckpt), *flags]
    with spawn_server(command=command, port=0) as (url, _), out.open('w') as f,\
         httpx.Client(base_url=url, timeout=30) as c:
        for method, path, body in todo:
            content = None if body is None else json.dumps(body)
            try: r = c.request(method, path, content=content, headers={'content-type': 'application/json'})
            except httpx.TransportError:        # a server that failed a request may close the kept-alive connection
                r = c.request(method, path, content=content, headers={'content-type': 'application/json'})
            js = r.json() if 'json' in r.headers.get('content-type', '') else None
            answer = js['error']['message'] if r.status_code >= 400 and isinstance(js, dict) and 'error' in js else None
            if r.status_code < 400 and method == 'POST': answer = stable(path, body, js)
            f.write(json.dumps({'request': [method, path, body], 'status': r.status_code, 'answer': answer}) + '\n')
    print(f"{len(todo)} cases -> {out}")

def compare(a: Path, b: Path) -> int:
    A, B = a.read_text().splitlines(), b.read_text().splitlines()
    if len(A) != len(B): print(f"{a}: {len(A)} cases, {b}: {len(B)}: not the same cases")
    diff = [(json.loads(x), json.loads(y)) for x, y in zip(A, B) if x != y]
    kinds = {}
    for x, y in diff:
        key = (x['request'][1], x['status'], y['status'], str(x['answer'])[:150], str(y['answer'])[:150])
        kinds[key] = kinds.get(key, 0) + 1
    for (path, s0, s1, a0, a1), k in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"{k:5d} x {path}: {s0} -> {s1}\n        {a0!r}\n     -> {a1!r}")
    print(f"{len(A)} cases, {len(diff)} answered differently")
    return 1 if diff or len(A) != len(B) else 0

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--tree', type=Path, help='a checkout of nanoserve with its .venv')
    p.add_argument('--cases', type=Path, default=Path('fuzz_cases.json'), help='made on the first run, replayed after')
    p.add_argument('--out', type=Path)
    p.add_argument('--examples', type=int, default=300, help='cases a route, when the cases are made')
    p.add_argument('--compare', nargs=2, type=Path, metavar=('A', 'B'))
    a = p.parse_args()
    if a.compare: sys.exit(compare(*a.compare))
    record(a.tree.resolve(), a.cases, a.out, a.examples)
