"""Peak resident memory of `nanoserve generate` beside its budget: the weights + the KV pool + 0.5 GB.

    python bench/memory.py [--models default,llama-1b] [--modes default,no-batch-invariant,int8,int4] [--out DIR]
    python bench/memory.py --pythonpath OLD_CHECKOUT --label before ...      # another tree's nanoserve, same venv
    python bench/memory.py --command serve ...                                  # `nanoserve serve`, one request

For each model and mode, `/usr/bin/time -v` runs `nanoserve generate` (one short prompt, 16 tokens, `--num-kv-blocks`
the model's context needs) and its "Maximum resident set size" is the peak. With `--command serve`, it runs `nanoserve
serve` with the same flags instead, sends it one completion through its OpenAI route, reads the peak it reports on
/health, and stops it with SIGINT: the row keeps both peaks. The weights are the checkpoint's tensors in
bfloat16, the KV pool its blocks' bytes. `llama-1b` is a random checkpoint of Llama-3.2-1B's shapes (1.24B parameters,
tied embeddings), written once under bench/out/ (LLAMA_1B_RANDOM in the commands). Appends to memory.csv, with the
machine and the command."""
import argparse, csv, json, os, re, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_EXTRA = 0.5 * 2**30          # the runtime's allowance beside the weights and the KV pool
MODES = {'default': [], 'no-batch-invariant': ['--no-batch-invariant'], 'no-pack-weights': ['--no-pack-weights'],
         'int8': ['--quantization', 'int8'], 'int4': ['--quantization', 'int4']}
LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048, tie_word_embeddings=True,
                rope_theta=500000.0)

def model_dir(name: str) -> Path:
    "The checkpoint of `name`: the default model (pulled), or the random 1B one (written once)."
    if name == 'default':
        from nanoserve.pull import resolve_model
        return Path(resolve_model(None, log=lambda m: None))
    path = ROOT/'bench'/'out'/'llama-1b-random'
    if not (path/'config.json').exists():
        import torch
        from nanoserve.tiny import tiny_checkpoint
        print(f"writing a random checkpoint of Llama-3.2-1B's shapes to {path} (once)", file=sys.stderr)
        tiny_checkpoint(path, seed=0, corpus=('hello world',) * 4, dtype=torch.bfloat16, **LLAMA_1B)
    return path

def weight_bytes(path: Path) -> int:
    "The checkpoint's tensors in bfloat16: two bytes a parameter (the model's bytes as the engine holds them)."
    from nanoserve.weights import read_headers, checkpoint_files
    return sum(2 * _numel(info.shape) for info in read_headers(checkpoint_files(path)).values())

def _numel(shape) -> int:
    n = 1
    for d in shape: n *= d
    return n

def kv_blocks_and_bytes(path: Path, block_size: int = 16) -> tuple[int, int]:
    "The blocks one request of the full context needs (max_model_len 2048), and their bytes in bfloat16."
    cfg = json.loads((path/'config.json').read_text())
    heads = cfg['num_attention_heads']
    head_dim = cfg.get('head_dim') or cfg['hidden_size'] // heads
    blocks = 2048 // block_size
    per_token = cfg['num_hidden_layers'] * 2 * cfg.get('num_key_value_heads', heads) * head_dim * 2
    return blocks, blocks * block_size * per_token

def peak(path: Path, blocks: int, flags: list[str], env: dict) -> tuple[int, str]:
    "The peak RSS in bytes of one `nanoserve generate`, and the command."
    cmd = ['/usr/bin/time', '-v', str(Path(sys.executable).parent/'nanoserve'), 'generate', '--model', str(path),
           '--dtype', 'bfloat16', '--max-model-len', '2048', '--num-kv-blocks', str(blocks), '--max-tokens', '16',
           *flags, 'The capital of France is']
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    m = re.search(r'Maximum resident set size \(kbytes\): (\d+)', done.stderr)
    if done.returncode or not m: raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return int(m.group(1)) * 1024, ' '.join(['nanoserve', *cmd[3:]])

def serve_peak(path: Path, blocks: int, flags: list[str], env: dict) -> tuple[int, str, int]:
    "The peak RSS in bytes of one `nanoserve serve` that answered one completion, its command, and /health's peak."
    import httpx
    from nanoserve.loadgen import spawn_server
    args = ['serve', '--model', str(path), '--dtype', 'bfloat16', '--max-model-len', '2048', '--num-kv-blocks',
            str(blocks), *flags, '--port', '0']
    with tempfile.NamedTemporaryFile('r', suffix='.time') as out:
        cmd = ['/usr/bin/time', '-o', out.name, '-v', str(Path(sys.executable).parent/'nanoserve'), *args]
        with spawn_server(command=cmd, port=0, env=env, cwd=tempfile.gettempdir()) as (url, _):
            name = httpx.get(url + '/v1/models').json()['data'][0]['id']
            r = httpx.post(url + '/v1/completions', json={'model': name, 'prompt': 'The capital of France is',
                                                          'max_tokens': 16}, timeout=300)
            r.raise_for_status()
            health = httpx.get(url + '/health').json()['stats']['peak_rss_bytes']
        m = re.search(r'Maximum resident set size \(kbytes\): (\d+)', out.read())
    if not m: raise SystemExit(f"{' '.join(cmd)} wrote no peak")
    return int(m.group(1)) * 1024, ' '.join(['nanoserve', *args]), health

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', default='default,llama-1b')
    p.add_argument('--modes', default='default,no-batch-invariant')
    p.add_argument('--pythonpath', default=None, help="run another checkout's nanoserve (same venv)")
    p.add_argument('--label', default='nanoserve')
    p.add_argument('--command', choices=['generate', 'serve'], default='generate')
    p.add_argument('--out', type=Path, default=ROOT/'bench'/'out'/'memory')
    a = p.parse_args()
    env = {**os.environ, 'OMP_NUM_THREADS': os.environ.get('OMP_NUM_THREADS', '2')}
    if a.pythonpath: env['PYTHONPATH'] = str(Path(a.pythonpath).resolve())
    from nanoserve.offline_bench import machine
    rows = []
    for name in a.models.split(','):
        path = model_dir(name)
        weights = weight_bytes(path)
        blocks, kv = kv_blocks_and_bytes(path)
        for mode in a.modes.split(','):
            if a.command == 'serve': rss, cmd, health = serve_peak(path, blocks, MODES[mode], env)
            else: (rss, cmd), health = peak(path, blocks, MODES[mode], env), None
            cmd = cmd.replace(str(path), 'SmolLM2-135M-Instruct' if name == 'default' else 'LLAMA_1B_RANDOM')
            budget = weights + kv + BUDGET_EXTRA
            rows.append(dict(label=a.label, model=name, mode=mode, weights_mb=round(weights / 2**20, 1),
                             kv_pool_mb=round(kv / 2**20, 1), budget_mb=round(budget / 2**20, 1),
                             peak_rss_mb=round(rss / 2**20, 1), within=rss <= budget, command=cmd,
                             health_peak_mb=None if health is None else round(health / 2**20, 1)))
            r = rows[-1]
            verdict = 'within' if r['within'] else 'OVER'
            print(f"{a.label:<10} {name:<9} {mode:<19} peak {r['peak_rss_mb']:8.1f} MB  "
                  f"budget {r['budget_mb']:8.1f} MB (weights {r['weights_mb']}, KV {r['kv_pool_mb']}, +512)  {verdict}",
                  flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out/'memory.csv'
    old = list(csv.DictReader(open(path))) if path.exists() else []
    new = [r | {'machine': machine()} for r in rows]
    # the columns of both, the older rows' new ones left empty
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in old + new for k in r)), restval='')
        w.writeheader()
        w.writerows(old + new)
    print(f"-> {a.out/'memory.csv'} ({machine()})")

if __name__ == '__main__':
    main()
