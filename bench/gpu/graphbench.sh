#!/usr/bin/env bash
# Run THERE (the lent GPU machine), after bench/gpu/prepare.sh here; one call, inside 8 minutes:
#   device run(command="bash bench/gpu/graphbench.sh", carry=[".whl", ".gpu"], timeout_s=540)
# Coverage (no weights), then the three CUDA arms of `nanoserve bench graph` (cuda_graph, compile, eager) on a random-weight
# checkpoint of the default model's shape in bfloat16 with its real tokenizer; CSVs, plots and the log under $OUT.
set -euo pipefail
: "${OUT:?OUT is unset: this script runs through the device tool, which sets it}"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no NVIDIA GPU here: bench/gpu/graphbench.sh is for the lent GPU machine; run nanoserve bench graph on a CPU instead"; exit 2
fi
[ -d .whl ] && [ -d .gpu/smollm2 ] || { echo "carry .whl and .gpu (made by bench/gpu/prepare.sh)"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
printf '#!/usr/bin/env python3\nimport sys\nfrom nanoserve.cli import main\nsys.exit(main())\n' > "$BIN/nanoserve"; chmod +x "$BIN/nanoserve"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
python3 - <<'PY'
import json, shutil, torch, transformers
cfg = transformers.LlamaConfig(**json.load(open('.gpu/smollm2/config.json')))
transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained('/tmp/smollm2-random')
for f in ('tokenizer.json', 'tokenizer_config.json'):
    try: shutil.copy(f'.gpu/smollm2/{f}', '/tmp/smollm2-random/')
    except FileNotFoundError: pass
PY
nanoserve bench graph --coverage --csv "$OUT/graphbench_coverage.csv" | tee "$OUT/graphbench.txt"
nanoserve bench graph --model /tmp/smollm2-random --arms eager,cuda_graph,compile --rates 1,4,16 --num-requests 32 \
  --serve-args "--dtype bfloat16 --max-batch-size 32" --csv "$OUT/graphbench_cuda.csv" 2>&1 | tee -a "$OUT/graphbench.txt"
