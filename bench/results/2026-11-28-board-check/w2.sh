#!/usr/bin/env bash
cd /work/main
for t in local shm; do
  for i in $(seq 1 10); do
    for v in old new; do
      python3 bench/peers/side_by_side.py --collectix /tmp/collectix-$v --transport $t --collectives all_reduce broadcast reduce barrier --sizes 4 --ranks 2 4 --rounds 1 --iters 20 --out /tmp/bench3/$t-$v-$i > /dev/null 2>&1 || echo "fail $t $v $i"
    done
  done
done
