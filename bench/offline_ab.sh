#!/usr/bin/env bash
# `nanoserve bench offline` with the engine's defaults against the same with FLAGS, in alternating runs (the order flipped each round),
# so that a VM's drift over minutes falls on both arms alike.  Each run's CSV (with the machine line) goes to OUT/<arm>_round<k>.csv;
# the tables and the commands to OUT/offline_ab.txt.  Not part of CI.
#
#   bench/offline_ab.sh "--no-amx-linear" 3 bench/results/offline_ab bfloat16   (the committed run: bench/results/archive/thirteenth_pass/offline_ab)
set -euo pipefail
FLAGS=${1:?flags of the second arm, e.g. "--no-amx-linear"}; ROUNDS=${2:-3}; OUT=${3:-bench/results/offline_ab}; DTYPES=${4:-bfloat16}
NANOSERVE=${NANOSERVE:-.venv/bin/nanoserve}
ARM=$(echo "$FLAGS" | sed 's/^--//; s/ --/+/g; s/ /=/g')
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order="default $ARM"; else order="$ARM default"; fi
  for arm in $order; do
    flags=(); [[ $arm == default ]] || read -r -a flags <<< "$FLAGS"
    "$NANOSERVE" bench offline --dtypes "$DTYPES" --repeats 1 "${flags[@]}" --csv "$OUT/${arm}_round$r.csv" 2>&1 | grep -v '^\[' | tail -n 4 | tee -a "$OUT/offline_ab.txt"
    echo "command: nanoserve bench offline --dtypes $DTYPES --repeats 1 ${flags[*]} --csv $OUT/${arm}_round$r.csv (round $r, arm $arm)" >> "$OUT/offline_ab.txt"
  done
done
