#!/usr/bin/env bash
# `nanoserve bench offline` with this checkout's bfloat16 product kernel against the same with the thirteenth pass's
# (bench/nanoserve_13th.py), in alternating runs (the order flipped each round), so that a VM's drift over minutes falls on both
# arms alike.  Each run's CSV (with the machine line) goes to OUT/<arm>_round<k>.csv; the tables and the commands to OUT/kernel_ab.txt.
# Not part of CI.
#
#   bench/kernel_ab.sh 3 bench/results/fourteenth_pass/kernel_ab bfloat16
set -euo pipefail
ROUNDS=${1:-3}; OUT=${2:-bench/results/kernel_ab}; DTYPES=${3:-bfloat16}
PY=${PY:-.venv/bin/python}; NANOSERVE=${NANOSERVE:-.venv/bin/nanoserve}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order="today thirteenth"; else order="thirteenth today"; fi
  for arm in $order; do
    if [[ $arm == today ]]; then cmd=("$NANOSERVE"); else cmd=("$PY" bench/nanoserve_13th.py); fi
    "${cmd[@]}" bench offline --dtypes "$DTYPES" --repeats 1 --csv "$OUT/${arm}_round$r.csv" 2>&1 | grep -v '^\[' | tail -n 4 | tee -a "$OUT/kernel_ab.txt"
    echo "command: ${cmd[*]} bench offline --dtypes $DTYPES --repeats 1 --csv $OUT/${arm}_round$r.csv (round $r, arm $arm)" >> "$OUT/kernel_ab.txt"
  done
done
