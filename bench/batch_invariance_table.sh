#!/usr/bin/env bash
# The batch-invariance issue's table on this machine: the twelve seeded chat requests of tests/test_batch_invariance.py (with
# two logprobs each) through `nanoserve generate --prompts-file`, alone (--max-batch-size 1) against a crowd of 8, and against
# a crowd of 8 in a 12-block pool that preempts; tokens and logprobs compared bit for bit, per mode, each mode beside itself
# with --no-batch-invariant (the control). Every run has a token budget of 16 a step (the test's workload): each prompt's
# prefill is chunked where the batch puts it. Writes bench/results/batch_invariance_table.txt. Run from the repository root
# with the venv active. Not part of CI.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python - "$tmp/prompts.jsonl" <<'PY'
import json, sys
sys.path.insert(0, 'tests')
from test_batch_invariance import seeded_requests
open(sys.argv[1], 'w').write(''.join(json.dumps(r) + '\n' for r in seeded_requests()))
PY
same() {
python - "$1" "$2" <<'PY'
import json, sys
a, b = ([(r['token_ids'], r['logprobs']) for r in map(json.loads, open(f))] for f in sys.argv[1:3])
d = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
t = [i for i, (x, y) in enumerate(zip(a, b)) if x[0] != y[0]]
print('yes' if not d else f'no: logprobs of requests {d} differ, tokens of {t}', end='')
PY
}
row() {
  local name=$1; shift
  local gen=(nanoserve generate --prompts-file "$tmp/prompts.jsonl" --json --max-num-batched-tokens 16)
  "${gen[@]}" --max-batch-size 1 "$@" > "$tmp/alone" 2>/dev/null
  "${gen[@]}" --max-batch-size 8 "$@" > "$tmp/crowd" 2>/dev/null
  "${gen[@]}" --max-batch-size 8 "$@" --num-kv-blocks 12 --max-model-len 192 > "$tmp/pool" 2>/dev/null
  echo "| $name | $(same "$tmp/alone" "$tmp/crowd") | $(same "$tmp/alone" "$tmp/pool") |"
}
{
  echo "machine: $(python -c 'from nanoserve.offline_bench import machine; print(machine())')"
  echo "| mode (default model, --max-num-batched-tokens 16) | crowd of 8 equals alone | in a 12-block pool (--num-kv-blocks 12 --max-model-len 192) |"
  echo "|---|---|---|"
  for mode in "" "--dtype float32" "--quantization int8" "--quantization int4" \
              "--cuda-graphs --warm-rows 8 --max-model-len 192"; do
    row "${mode:-auto dtype, default flags}" $mode
    row "${mode:-auto dtype} --no-batch-invariant (the control)" $mode --no-batch-invariant
  done
  row "auto dtype, --batch-invariant" --batch-invariant
  echo "command: bash bench/batch_invariance_table.sh"
} | tee bench/results/batch_invariance_table.txt
