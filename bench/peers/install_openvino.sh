#!/usr/bin/env bash
# Install OpenVINO GenAI (PyPI `openvino-genai`) and optimum-intel (whose `optimum-cli export openvino` writes the IR
# it reads) as a peer in its own venv, outside the repo. Idempotent: re-running only repairs what is missing.
#
#   bench/peers/install_openvino.sh            # -> /work/peers/openvino
#   OPENVINO_VENV=/some/where bench/peers/install_openvino.sh
#
# Then bench/peers/openvino_side_by_side.py runs it beside nanoserve (through bench/peers/openvino_peer.py).
set -euo pipefail

OPENVINO_VENV=${OPENVINO_VENV:-/work/peers/openvino}
GENAI_VERSION=${OPENVINO_GENAI_VERSION:-2026.4.1.0}
OPTIMUM_INTEL_VERSION=${OPTIMUM_INTEL_VERSION:-2.2.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}      # the CPU build on local disk (pip's find-links /opt/wheels)
source "$(dirname "$0")/peer_venv.sh"
peer_venv "$OPENVINO_VENV"

cpu_torch() {  # install torch's CPU build without its dependencies (they are already there)
    "${PIP[@]}" install --no-deps "torch==$TORCH_VERSION"
    installed torch "$TORCH_VERSION+cpu" || {
        echo "torch $TORCH_VERSION installed without +cpu: a CUDA build was picked" >&2
        exit 1
    }
}

# 1. torch first, the CPU build. optimum-intel's export traces the model with torch; PyPI's torch is the multi-GB
#    CUDA build, and elsewhere the CPU one comes with e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
if ! installed torch "$TORCH_VERSION+cpu"; then
    "${PIP[@]}" install "torch==$TORCH_VERSION"
    installed torch "$TORCH_VERSION+cpu" || {
        echo "torch $TORCH_VERSION installed without +cpu: a CUDA build was picked" >&2
        exit 1
    }
fi

# 2. GenAI (it brings openvino and openvino-tokenizers of its own release) and optimum-intel with its openvino extra
#    (nncf among them). Guarded, because re-running it would bring back the torchvision step 3 removes.
if ! installed openvino-genai "$GENAI_VERSION" || ! installed optimum-intel "$OPTIMUM_INTEL_VERSION"; then
    "${PIP[@]}" install "openvino-genai==$GENAI_VERSION" "optimum-intel[openvino]==$OPTIMUM_INTEL_VERSION" \
        "torch==$TORCH_VERSION"
fi

# 3. The trap: optimum-intel requires torchvision outright, and PyPI's torchvision is a CUDA build that can drag a CUDA
#    torch (and the nvidia, cuda and triton packages) in with it; a torchvision built for another torch also breaks
#    `import transformers`. Text generation needs none of it: remove torchvision and whatever CUDA came with it, and
#    put the CPU torch back without touching its dependencies.
if installed torchvision ""; then
    "${PIP[@]}" uninstall -y torchvision
fi
CUDA_DISTS=$("$PY" - <<'PYEOF'
import importlib.metadata as m
names = {d.metadata['Name'] for d in m.distributions()}
print(' '.join(sorted(n for n in names if n and n.lower().startswith(('nvidia-', 'cuda-', 'triton')))))
PYEOF
)
if [[ -n "$CUDA_DISTS" ]]; then
    # shellcheck disable=SC2086  # one word a distribution
    "${PIP[@]}" uninstall -y $CUDA_DISTS
fi
if ! installed torch "$TORCH_VERSION+cpu"; then
    "${PIP[@]}" uninstall -y torch || true
    cpu_torch
fi

# 4. Smoke check (no model): the pipelines import, optimum-intel's exporter imports, torch is the CPU build.
"$PY" - <<'PYEOF'
import importlib.metadata as m
import torch, openvino, openvino_genai
import optimum.intel
from optimum.exporters.openvino import main_export  # noqa: F401 (what optimum-cli export openvino runs)
assert '+cpu' in torch.__version__, torch.__version__
print(f"ok: openvino-genai {openvino_genai.__version__}, openvino {openvino.__version__},",
      f"optimum-intel {m.version('optimum-intel')}, transformers {m.version('transformers')},",
      f"torch {torch.__version__}")
PYEOF
echo "OpenVINO GenAI peer ready in $OPENVINO_VENV"
