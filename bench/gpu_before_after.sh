#!/usr/bin/env bash
# The before/after command of docs/gpu.md (2026-11-27): on the GPU machine, from the
# repository root, with .gpu/ carried. It expects, besides `bash bench/gpu_checks.sh build`'s
# binaries, the old ones as .gpu/collectix_old and .gpu/gpu_bench_old (built the same way from
# the older commit, e.g. in a git worktree with its own CARGO_TARGET_DIR) and .gpu/gpu_bench
# (`cargo build --release --features cuda --example gpu_bench`). Logs go to /tmp/g and, packed,
# to $OUT/g.tgz when OUT is set.
set -u; mkdir -p /tmp/g
nvidia-smi --query-gpu=name,driver_version --format=csv > /tmp/g/smi.txt 2>&1
(timeout 120 .gpu/cuda_local_tests --test-threads=1 --nocapture > /tmp/g/local.log 2>&1; echo rc=$? >> /tmp/g/local.log)
(timeout 100 .gpu/cuda_tests --test-threads=1 --nocapture > /tmp/g/cuda.log 2>&1; echo rc=$? >> /tmp/g/cuda.log)
grep -hE "test result|rc=" /tmp/g/local.log /tmp/g/cuda.log
for i in 1 2; do
  timeout 60 .gpu/gpu_bench_old 1024 > /tmp/g/gb_old_$i.log 2>&1; echo "rc=$?" >> /tmp/g/gb_old_$i.log
  timeout 60 .gpu/gpu_bench 1024 > /tmp/g/gb_new_$i.log 2>&1; echo "rc=$?" >> /tmp/g/gb_new_$i.log
done
timeout 90 python3 bench/torch_nccl.py 1024 > /tmp/g/torch.log 2>&1
for b in old new; do
  x=.gpu/collectix; [ $b = old ] && x=.gpu/collectix_old
  timeout 60 $x bench --device cuda --ranks 1 --collective all_reduce -b 4 -e 1G -f 16 -n 10 > /tmp/g/cb1_$b.log 2>&1
done
for n in 2 4 8; do
  timeout 40 .gpu/collectix bench --device cuda --ranks $n --collective all_reduce -b 4 -e 256M -f 16 -n 5 > /tmp/g/local_$n.log 2>&1
  timeout 40 .gpu/collectix bench --device cuda --ranks $n --backend staged --collective all_reduce -b 4 -e 16M -f 16 -n 3 > /tmp/g/staged_$n.log 2>&1
done
for c in all_gather reduce_scatter broadcast all_to_all; do
  timeout 30 .gpu/collectix bench --device cuda --ranks 4 --collective $c -b 4 -e 64M -f 64 -n 5 > /tmp/g/l4_$c.log 2>&1
done
grep -H "per call\|rc=" /tmp/g/gb_*.log /tmp/g/torch.log
[ -n "${OUT:-}" ] && tar czf "$OUT/g.tgz" -C /tmp g
