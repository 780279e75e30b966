#!/usr/bin/env bash
# Run HERE (the CPU machine) before a device call: puts into ignored folders what the GPU machine lacks and cannot download.
#   .whl/          the wheels bench/gpu/wheels.py derives (cp312, manylinux), at this checkout's .venv versions, and
#                  .whl/carried.txt, the list (name==version  # why)
#   .gpu/smollm2/  the default model's config.json and tokenizer files (the weights do not travel: run.sh makes random ones)
# Then one call: device run(command="bash bench/gpu/run.sh", carry=[".whl", ".gpu"], timeout_s=540).
# --dry-run: print the list and touch nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "no .venv here: run make install-test first" >&2; exit 2; }
LIST=$($PY bench/gpu/wheels.py --why)
if [ "${1:-}" = "--dry-run" ]; then echo "$LIST"; exit 0; fi
MODEL=$(.venv/bin/nanoserve pull)
rm -rf .whl
mkdir -p .gpu/smollm2 .whl
cp "$MODEL/config.json" "$MODEL/tokenizer.json" .gpu/smollm2/
[ -f "$MODEL/tokenizer_config.json" ] && cp "$MODEL/tokenizer_config.json" .gpu/smollm2/
echo "$LIST" > .whl/carried.txt
# one download, no dependencies resolved here: the list is the closure already
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_34_x86_64 --platform any -d .whl $(echo "$LIST" | sed 's/ *#.*//')
want=$(echo "$LIST" | wc -l)
got=$(ls .whl/*.whl | wc -l)
[ "$got" -eq "$want" ] || { echo "downloaded $got wheels for $want packages" >&2; exit 1; }
du -sh .whl .gpu
