#!/usr/bin/env bash
# Before (/tmp/collectix-base2: `cargo build --release -p collectix-cli` at 929ebda, in a git
# worktree) and after (/tmp/collectix-cur2: the same at 1e5cd2f, the board's wake rule in the
# runtime with its mirror written under a lock), alternating, 6 rounds, ranks in processes
# of one host over shared memory, the small cells. Then
# `python3 bench/peers/ab_summary.py bench/results/2026-11-28-board-wake 'runs/shm-base2-*' 'runs/shm-cur2-*'`.
cd "$(git rev-parse --show-toplevel)"
for i in 1 2 3 4 5 6; do
  for v in base2 cur2; do
    python3 bench/peers/side_by_side.py --collectix /tmp/collectix-$v --transport shm \
      --collectives all_reduce broadcast reduce barrier --sizes 4 \
      --ranks 2 4 --rounds 1 --out bench/results/2026-11-28-board-wake/runs/shm-$v-$i
  done
done
