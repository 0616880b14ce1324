#!/usr/bin/env bash
# The local reduce at W = 2 again, alone, 10 alternating runs (the first runs' medians moved
# 25 %, within their range). Then
# `python3 bench/peers/ab_summary.py bench/results/2026-11-29-one-input 'runs/reduce-base-*' 'runs/reduce-cur-*' --label local`.
cd "$(git rev-parse --show-toplevel)"
for i in 1 2 3 4 5 6 7 8 9 10; do
  for v in base cur; do
    python3 bench/peers/side_by_side.py --collectix /tmp/collectix-${v}3 --transport local \
      --collectives reduce --sizes 4 --ranks 2 --rounds 1 \
      --out bench/results/2026-11-29-one-input/runs/reduce-$v-$i
  done
done
