#!/usr/bin/env bash
# Run vLLM's CPU build (installed by install_vllm.sh) as a peer OpenAI-compatible
# server on 127.0.0.1.
#
#   serve_vllm.sh MODEL_DIR PORT [extra `vllm serve` args...]
#
# Env knobs:
#   VLLM_VENV   venv made by install_vllm.sh            (default /work/peers/vllm)
#   CPUS        pin the whole server with `taskset -c $CPUS` (e.g. 0 or 0,1);
#               unset/empty = no pinning
#   SERVED_NAME --served-model-name                     (default: basename MODEL_DIR)
#   VLLM_CPU_KVCACHE_SPACE  KV cache size in GiB        (default 2)
#   VLLM_CPU_OMP_THREADS_BIND  "auto" (default: 1 OpenMP thread per allowed core,
#               minus 1 core reserved for the front end/scheduler when >1 allowed),
#               "nobind", or an explicit list such as "0" or "0-1"
#   DTYPE, MAX_MODEL_LEN    (defaults float32, 2048)
# The process execs vllm, so `kill -- -$PGID` / `kill $PID` of this script stops it
# (vllm forks an engine-core child in the same process group: kill the group).
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 MODEL_DIR PORT [extra vllm serve args...]" >&2
    exit 2
fi
MODEL_DIR=$1; PORT=$2; shift 2
VLLM_VENV=${VLLM_VENV:-/work/peers/vllm}
[[ -x "$VLLM_VENV/bin/vllm" ]] || { echo "no $VLLM_VENV/bin/vllm: run install_vllm.sh" >&2; exit 1; }
[[ -d "$MODEL_DIR" ]] || { echo "no model directory $MODEL_DIR" >&2; exit 1; }

# No network except package registries: never touch the HF hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# Belt and braces: platform detection would also find "+cpu" in the version.
export VLLM_TARGET_DEVICE=cpu
# The CPU backend reserves its KV cache up front (default would be 0 -> 4 GiB+).
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-auto}

cmd=("$VLLM_VENV/bin/vllm" serve "$MODEL_DIR"
     --served-model-name "${SERVED_NAME:-$(basename "$MODEL_DIR")}"
     --host 127.0.0.1 --port "$PORT"
     --dtype "${DTYPE:-float32}" --max-model-len "${MAX_MODEL_LEN:-2048}"
     "$@")
if [[ -n "${CPUS:-}" ]]; then
    cmd=(taskset -c "$CPUS" "${cmd[@]}")
fi
echo "+ ${cmd[*]}" >&2
exec "${cmd[@]}"
