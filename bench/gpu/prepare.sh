#!/usr/bin/env bash
# Run HERE (the CPU machine) before a device call: puts into ignored folders what the GPU machine lacks and cannot download.
#   .whl/          the wheels nanoserve needs there (cp312, manylinux), at the versions of this checkout's .venv
#   .gpu/smollm2/  the default model's config.json and tokenizer.json (the weights do not travel: the GPU script makes random ones)
# Then: device run(command="bash bench/gpu/graphbench.sh", carry=[".whl", ".gpu"], timeout_s=540).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
MODEL=$(.venv/bin/nanoserve pull)
mkdir -p .gpu/smollm2 .whl
cp "$MODEL/config.json" "$MODEL/tokenizer.json" .gpu/smollm2/
[ -f "$MODEL/tokenizer_config.json" ] && cp "$MODEL/tokenizer_config.json" .gpu/smollm2/
# what the GPU machine lacks (shared/GPU.md), pinned to what this checkout runs with
NEED="fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn h11 click anyio sniffio gguf fastcore openai distro jiter"
for name in $NEED; do
  version=$($PY -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)
  [ -n "$version" ] || { echo "skipping $name: this checkout's .venv does not use it"; continue; }
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$name==$version"
done
du -sh .whl .gpu
