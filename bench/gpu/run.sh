#!/usr/bin/env bash
# The one GPU call. Run THERE (the lent GPU machine) after bench/gpu/prepare.sh HERE:
#   device run(command="bash bench/gpu/run.sh", carry=[".whl", ".gpu"], timeout_s=540)
# Inside 8 minutes (BUDGET seconds, every step bounded by what is left): install the carried wheels, build a random-weight
# checkpoint of the default model's shape (bfloat16, its final norm scaled so its logits have margins: checkpoint.py), run the
# CUDA tests (pytest -m cuda), the graph bench's arms against eager at 1, 2, 4, 8 and 16 requests a second, and the offline
# bench against transformers at batch 1, 64 and 256 with the card's own ceilings. Everything under $OUT: log.txt, the CSVs, the
# plot, gpu.txt (card, driver, torch). A step that fails or runs out of time is logged with its exit code; the next one runs.
# Without a GPU it refuses at once, installing nothing (exit 2).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${BUDGET:-470}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no NVIDIA GPU here (nvidia-smi sees none): bench/gpu/run.sh is for the lent GPU machine; on a CPU run make test" >&2
  exit 2
fi
: "${OUT:?OUT is unset: this script runs through the device tool, which sets it}"
[ -f .whl/carried.txt ] && [ -f .gpu/smollm2/config.json ] || { echo "carry .whl and .gpu: run bench/gpu/prepare.sh first" >&2; exit 2; }
exec > >(tee -a "$OUT/log.txt") 2>&1
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {   # step NAME SECONDS COMMAND...: run it under min(SECONDS, time left); log its exit code and time
  local name=$1 want=$2; shift 2
  local t=$(( want < $(left) ? want : $(left) ))
  if [ "$t" -lt 20 ]; then echo "=== $name: skipped, $(left) s left"; return; fi
  echo "=== $name (at most $t s) $(date +%T)"
  local s=$(date +%s)
  timeout "$t" "$@"
  echo "=== $name: rc=$? in $(( $(date +%s) - s )) s"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
printf '#!/usr/bin/env python3\nimport sys\nfrom nanoserve.cli import main\nsys.exit(main())\n' > "$BIN/nanoserve"
chmod +x "$BIN/nanoserve"
python3 -c "import nanoserve.cli, nanoserve.server, openai, llguidance; import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
  | tee -a "$OUT/gpu.txt" || { echo "an import failed: the carried wheels miss something (bench/gpu/wheels.py)"; exit 3; }
MODEL=/tmp/smollm2-random
step checkpoint 60 python3 bench/gpu/checkpoint.py .gpu/smollm2 $MODEL --dtype bfloat16 --scale 16
step cuda-tests 110 python3 -m pytest -q -x -m cuda -p no:cacheprovider tests/test_cuda.py
step graph 140 nanoserve bench graph --model $MODEL --arms eager,cuda_graph --rates 1,2,4,8,16 --num-requests 16 \
  --serve-args "--dtype bfloat16 --max-batch-size 16 --max-model-len 1024" --csv "$OUT/graphbench_cuda.csv"
step offline-256 100 nanoserve bench offline --model $MODEL --device cuda --dtypes bfloat16 --cuda-graphs --max-model-len 1024 \
  --num-requests 256 --max-batch-size 256 --compare-transformers --hf-batch-size 256 --batch1-requests 4 --csv "$OUT/offline_256.csv"
step offline-64 60 nanoserve bench offline --model $MODEL --device cuda --dtypes bfloat16 --cuda-graphs --max-model-len 1024 \
  --num-requests 64 --max-batch-size 64 --compare-transformers --hf-batch-size 64 --batch1-requests 0 --csv "$OUT/offline_64.csv"
step graph-compile 90 nanoserve bench graph --model $MODEL --arms eager,compile --rates 4,16 --num-requests 16 \
  --serve-args "--dtype bfloat16 --max-batch-size 16 --max-model-len 512" --csv "$OUT/graphbench_compile.csv"
cp bench/results/graphbench*.png "$OUT/" 2>/dev/null || true
echo "=== done in $(( $(date +%s) - START )) s"
