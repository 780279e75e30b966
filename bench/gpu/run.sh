#!/usr/bin/env bash
# The one GPU call. Run THERE (the lent GPU machine) after bench/gpu/prepare.sh HERE:
#   device run(command="bash bench/gpu/run.sh", carry=[".whl", ".gpu"], timeout_s=540)
# Inside 8 minutes (BUDGET seconds, every step bounded by what is left), what the card's targets name, most wanted first:
# install the carried wheels; build random-weight checkpoints of the default model's shape and of Qwen3-0.6B's (the model
# nano-vllm reports on; bfloat16, the final norm scaled so logits have margins: checkpoint.py); the CUDA tests (pytest -m
# cuda); nano-vllm's workload (256 sequences, prompts and outputs of 100-1,024 tokens) and batch 1's ms a token on the
# Qwen3 shape with the batch-invariant mode (the default); the graph bench's seven checks at 1, 2, 4, 8 and 16 requests a
# second; batch 1 on the default shape; the Qwen3 workload without the mode (its cost); then, while time is left, the
# offline bench against transformers.
# Everything under $OUT: log.txt, the CSVs, the plot, gpu.txt (card, driver, torch). A step that fails or runs out of
# time is logged with its exit code; the next one runs. Without a GPU it refuses at once, installing nothing (exit 2).
# --dry-run (here, on the CPU): every step's command printed, the checkpoints' shapes built on the meta device and the
# workload's plan drawn, in seconds; nothing installed, loaded or written outside a temporary $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${BUDGET:-470}
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ $DRY = 0 ] && { ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; }; then
  echo "no NVIDIA GPU here (nvidia-smi sees none): bench/gpu/run.sh is for the lent GPU machine; on a CPU run make test" >&2
  exit 2
fi
if [ $DRY = 1 ]; then
  OUT=${OUT:-$(mktemp -d)}
  PY=${PYTHON:-.venv/bin/python}
  SRC=${SRC:-$("$(dirname "$PY")/nanoserve" pull | tail -1)}
else
  : "${OUT:?OUT is unset: this script runs through the device tool, which sets it}"
  [ -f .whl/carried.txt ] && [ -f .gpu/smollm2/config.json ] || { echo "carry .whl and .gpu: run bench/gpu/prepare.sh first" >&2; exit 2; }
  PY=python3
  SRC=.gpu/smollm2
fi
exec > >(tee -a "$OUT/log.txt") 2>&1
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {   # step NAME SECONDS COMMAND...: run it under min(SECONDS, time left); log its exit code and time
  local name=$1 want=$2; shift 2
  if [ $DRY = 1 ]; then echo "=== $name (at most $want s): $*"; return; fi
  local t=$(( want < $(left) ? want : $(left) ))
  if [ "$t" -lt 20 ]; then echo "=== $name: skipped, $(left) s left"; return; fi
  echo "=== $name (at most $t s) $(date +%T)"
  local s=$(date +%s)
  timeout "$t" "$@"
  echo "=== $name: rc=$? in $(( $(date +%s) - s )) s"
}
if [ $DRY = 0 ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  BIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
  printf '#!/usr/bin/env python3\nimport sys\nfrom nanoserve.cli import main\nsys.exit(main())\n' > "$BIN/nanoserve"
  chmod +x "$BIN/nanoserve"
  python3 -c "import nanoserve.cli, nanoserve.server, openai, llguidance, triton; import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
    | tee -a "$OUT/gpu.txt" || { echo "an import failed: the carried wheels miss something (bench/gpu/wheels.py)"; exit 3; }
else
  echo "=== dry run: nothing installed; the card's commands below, the checkpoints' shapes and the workload's plan here"
  $PY bench/gpu/checkpoint.py "$SRC" /tmp/smollm2-random --dry-run || exit 1
  $PY bench/gpu/checkpoint.py "$SRC" /tmp/qwen3-0.6b-random --shape qwen3-0.6b --dry-run || exit 1
  $PY bench/gpu/nanovllm.py /tmp/qwen3-0.6b-random --dry-run --device cuda --dtype bfloat16 --cuda-graphs \
    --capture-recorder cuda_graph --max-batch-size 256 --max-num-batched-tokens 16384 || exit 1
fi
MODEL=/tmp/smollm2-random
QWEN=/tmp/qwen3-0.6b-random
CARD="--device cuda --dtype bfloat16 --cuda-graphs --capture-recorder cuda_graph"
step checkpoint 60 $PY bench/gpu/checkpoint.py $SRC $MODEL --dtype bfloat16 --scale 16
step checkpoint-qwen3 90 $PY bench/gpu/checkpoint.py $SRC $QWEN --dtype bfloat16 --scale 16 --shape qwen3-0.6b
step cuda-tests 100 $PY -m pytest -q -x -m cuda -p no:cacheprovider tests/test_cuda.py
step nanovllm-qwen3 120 $PY bench/gpu/nanovllm.py $QWEN $CARD --max-batch-size 256 --max-num-batched-tokens 16384 \
  --label qwen3-0.6b --csv "$OUT/nanovllm.csv"
step graph 120 nanoserve bench graph --model $MODEL --arms eager,cuda_graph --rates 1,2,4,8,16 --num-requests 16 \
  --serve-args "--dtype bfloat16 --max-batch-size 16 --max-model-len 1024" --csv "$OUT/graphbench_cuda.csv"
step batch1-default 40 $PY bench/gpu/nanovllm.py $MODEL $CARD --num-seqs 0 --label smollm2-135m --csv "$OUT/nanovllm.csv"
step nanovllm-qwen3-variant 90 $PY bench/gpu/nanovllm.py $QWEN $CARD --max-batch-size 256 --max-num-batched-tokens 16384 \
  --no-batch-invariant --label qwen3-0.6b-no-batch-invariant --csv "$OUT/nanovllm.csv"
step offline-256 100 nanoserve bench offline --model $MODEL --device cuda --dtypes bfloat16 --cuda-graphs --max-model-len 1024 \
  --num-requests 256 --max-batch-size 256 --compare-transformers --hf-batch-size 256 --batch1-requests 4 --csv "$OUT/offline_256.csv"
[ $DRY = 0 ] && cp bench/results/graphbench*.png "$OUT/" 2>/dev/null
echo "=== done in $(( $(date +%s) - START )) s"
