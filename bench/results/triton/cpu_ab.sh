#!/usr/bin/env bash
# CPU speed before (d37de51, a worktree at /work/before) and after the card's path, alternating whole runs (Day 75)
cd /work/main
for r in 1 2 3 4 5; do
  for arm in $( [ $((r % 2)) = 1 ] && echo "before after" || echo "after before" ); do
    for cfg in default no-decode-call; do
      extra=""; [ $cfg = no-decode-call ] && extra="--no-decode-call"
      pp=""; [ $arm = before ] && pp=/work/before
      PYTHONPATH=$pp .venv/bin/python -c "import sys; from nanoserve.cli import main; sys.exit(main())" bench offline --dtypes bfloat16 \
        --num-requests 32 --output-len 64 --max-batch-size 32 --batch1-requests 2 $extra --csv /work/ab/$arm-$cfg.csv > /work/ab/$arm-$cfg-$r.log 2>&1
      echo "$r $arm $cfg done $(date +%T)"
    done
  done
done
