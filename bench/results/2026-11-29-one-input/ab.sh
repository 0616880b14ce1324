#!/usr/bin/env bash
# Before (/tmp/collectix-base3: `cargo build --release -p collectix-cli` at 7311ec4, in a git
# worktree) and after (/tmp/collectix-cur3: the same at 74fabc4: the engine's one board input,
# Queue::submit, Communicator::call routing every call), alternating, 6 rounds, the small
# cells, ranks in one process (local) and in processes of one host over shared memory (shm).
# Then, for each transport T,
# `python3 bench/peers/ab_summary.py bench/results/2026-11-29-one-input 'runs/T-base-*' 'runs/T-cur-*' --label T`.
cd "$(git rev-parse --show-toplevel)"
for i in 1 2 3 4 5 6; do
  for t in local shm; do
    for v in base cur; do
      python3 bench/peers/side_by_side.py --collectix /tmp/collectix-${v}3 --transport $t \
        --collectives all_reduce broadcast reduce barrier --sizes 4 \
        --ranks 2 4 --rounds 1 --out bench/results/2026-11-29-one-input/runs/$t-$v-$i
    done
  done
done
