#!/usr/bin/env python
"""Boot time to healthy and the first request's latency, `nanoserve serve` on the default model, with and without `--cuda-graphs`.

    python bench/boot_serve.py [--model DIR] [--max-tokens 32] [--csv bench/results/boot_serve.csv]

Arms, one after another in this one run: eager; `--cuda-graphs` with a cold compile cache (a fresh TORCHINDUCTOR_CACHE_DIR);
`--cuda-graphs` again over that now-warm cache; `--cuda-graphs --no-warm` over the warm cache; and `--no-warm` over a cold one.
Each server is started unpinned (as `make serve` starts it), timed from the spawn to the first /health 200, then sent one
streaming completion (a 32-token prompt, greedy, `ignore_eos`) whose first token, second token and end are timed.
"""
import argparse, json, sys, tempfile, time
from pathlib import Path
import httpx
from nanoserve.pull import resolve_model
from nanoserve.loadgen import spawn_server
from nanoserve.tokenizer import Tokenizer
from nanoserve.offline_bench import machine, write_csv

def first_request(url: str, name: str, prompt: list[int], max_tokens: int) -> dict:
    "Time one streaming completion: first token, second token, end (ms from the send)."
    body = {'model': name, 'prompt': prompt, 'max_tokens': max_tokens, 'temperature': 0, 'ignore_eos': True, 'stream': True}
    t0, marks = time.perf_counter(), []
    with httpx.stream('POST', url + '/v1/completions', json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith('data: ') and line != 'data: [DONE]':
                ch = json.loads(line[6:])['choices']
                if ch and ch[0].get('text'): marks.append(time.perf_counter() - t0)
    end = time.perf_counter() - t0
    return {'ttft_ms': 1e3 * marks[0], 'second_token_ms': 1e3 * (marks[1] - marks[0]), 'e2e_ms': 1e3 * end, 'chunks': len(marks)}

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--max-tokens', type=int, default=32)
    p.add_argument('--csv', default='bench/results/boot_serve.csv')
    args = p.parse_args()
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr))
    name = Path(path).name
    prompt = Tokenizer.from_dir(path).encode(' '.join(['The quick brown fox jumps over the lazy dog.'] * 4))[:32]
    warm_dir, rows = tempfile.mkdtemp(prefix='inductor-'), []
    arms = [('eager', [], None), ('cuda-graphs, cold cache', ['--cuda-graphs'], warm_dir), ('cuda-graphs, warm cache', ['--cuda-graphs'], warm_dir),
            ('no-warm, warm cache', ['--cuda-graphs', '--no-warm'], warm_dir), ('no-warm, cold cache', ['--cuda-graphs', '--no-warm'], tempfile.mkdtemp(prefix='inductor-'))]
    for arm, flags, cache in arms:
        env = {'TORCHINDUCTOR_CACHE_DIR': cache} if cache else {}
        with spawn_server(path, *flags, env=env, timeout=900) as (url, healthy):
            h = httpx.get(url + '/health', timeout=10).json()
            req = first_request(url, name, prompt, args.max_tokens)
        cg, secs = h['cuda_graphs'], h['boot']['seconds']
        rows.append({'arm': arm, 'flags': ' '.join(flags), 'healthy_s': round(healthy, 2), 'load_s': secs.get('load', 0), 'kv_pool_s': secs.get('kv_pool', 0),
                     'warm_s': secs.get('warm', 0), 'shapes': cg['count'], 'recorded_at_boot': cg['recorded'], 'max_width': cg['max_width'],
                     'width_bound_by': cg['width_bound_by'], **{k: round(v, 1) for k, v in req.items()}, 'machine': machine()})
        print(rows[-1], file=sys.stderr, flush=True)
    write_csv(rows, args.csv)
    print(f"machine: {rows[0]['machine']}")
    print(f"{'arm':<26}{'healthy s':>10}{'warm s':>8}{'TTFT ms':>9}{'2nd token ms':>14}{'e2e ms':>9}")
    for r in rows: print(f"{r['arm']:<26}{r['healthy_s']:>10.1f}{r['warm_s']:>8.1f}{r['ttft_ms']:>9.0f}{r['second_token_ms']:>14.0f}{r['e2e_ms']:>9.0f}")
    print(f"wrote {args.csv}")

if __name__ == '__main__':
    main()
