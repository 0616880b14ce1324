#!/usr/bin/env bash
# Before (/tmp/collectix-base: `cargo build --release -p collectix-cli` at 2c34cbf, in a git
# worktree) and after (/tmp/collectix-cur: the same at this commit), alternating, 8 rounds,
# ranks in processes of one host over shared memory. Then
# `python3 bench/peers/ab_summary.py bench/results/2026-11-28-doorbell 'runs/shm6-base-*' 'runs/shm6-cur-*'`.
cd "$(git rev-parse --show-toplevel)"
for i in 1 2 3 4 5 6 7 8; do
  for v in base cur; do
    python3 bench/peers/side_by_side.py --collectix /tmp/collectix-$v --transport shm \
      --collectives all_reduce broadcast reduce barrier send_recv all_gather --sizes 4 8192 \
      --ranks 2 4 --rounds 1 --out bench/results/2026-11-28-doorbell/runs/shm6-$v-$i
  done
done
