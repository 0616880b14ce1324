#!/usr/bin/env bash
# Before (/tmp/w/collectix-base: `cargo build --release -p collectix-cli` at 227fa1c, in a git
# worktree) and after (/tmp/w/collectix-cur: the same with the ranks' shared threads, lazy
# links, shared members), alternating, 4 rounds, the small cells, ranks in one process (local)
# and in processes of one host over shared memory (shm). Then, for each transport T,
# `python3 bench/peers/ab_summary.py bench/results/2026-11-29-many-ranks 'runs/T-base-*' 'runs/T-cur-*' --label T`.
cd "$(git rev-parse --show-toplevel)"
for i in 1 2 3 4; do
  for t in local shm; do
    for v in base cur; do
      python3 bench/peers/side_by_side.py --collectix /tmp/w/collectix-${v} --transport $t \
        --collectives all_reduce broadcast reduce barrier --sizes 4 \
        --ranks 2 4 --rounds 1 --out bench/results/2026-11-29-many-ranks/runs/$t-$v-$i
    done
  done
done
