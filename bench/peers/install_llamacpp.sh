#!/usr/bin/env bash
# Install llama.cpp (through PyPI `llama-cpp-python`, which builds it from source with cmake and gcc) as a peer in its own venv,
# outside the repo, with the `gguf` package that bench/peers/llamacpp_peer.py uses to write an F16 GGUF. Idempotent.
#
#   bench/peers/install_llamacpp.sh          # -> /work/peers/llamacpp  (about 8-10 minutes on 2 cores)
#   LLAMACPP_VENV=/some/where bench/peers/install_llamacpp.sh
set -euo pipefail

LLAMACPP_VENV=${LLAMACPP_VENV:-/work/peers/llamacpp}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PYTHON=${PYTHON:-python3.11}

cd /tmp   # never let pip see the repo's own pyproject
if [[ ! -x "$LLAMACPP_VENV/bin/python" ]]; then
    mkdir -p "$(dirname "$LLAMACPP_VENV")"
    "$PYTHON" -m venv "$LLAMACPP_VENV"
fi
PY="$LLAMACPP_VENV/bin/python"
if ! "$PY" -c "import llama_cpp, gguf, numpy" 2>/dev/null; then
    nice -n 10 "$PY" -m pip install -q "llama-cpp-python==$VERSION" gguf numpy
fi
"$PY" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'in', '$LLAMACPP_VENV')"
