#!/usr/bin/env bash
# The before/after command of docs/gpu.md (2026-11-28, "the out-of-place cost found and
# removed"): on the GPU machine, from the repository root, with .gpu/ carried. It expects
# `bash bench/gpu_checks.sh build`'s binaries, .gpu/gpu_bench (`cargo build --release
# --features cuda --example gpu_bench`), and the older commit's collectix, cuda_tests and
# gpu_bench built the same way in .gpu/old/ (e.g. from a git worktree with its own
# CARGO_TARGET_DIR). The tests first, then old and new gpu_bench alternated with torch's
# script between, then `collectix bench` old and new. Logs go to /tmp/g and, packed, to
# $OUT/g.tgz when OUT is set (the device tool brings back only a few files).
set -u; mkdir -p /tmp/g
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/g/smi.txt 2>&1; date -u >> /tmp/g/smi.txt
(timeout 60 .gpu/cuda_local_tests --test-threads=1 > /tmp/g/local.log 2>&1; echo rc=$? >> /tmp/g/local.log)
(timeout 80 .gpu/cuda_tests --test-threads=1 > /tmp/g/cuda.log 2>&1; echo rc=$? >> /tmp/g/cuda.log)
grep -hE "test result|rc=|FAILED|panicked" /tmp/g/local.log /tmp/g/cuda.log | head -20
for i in 1 2; do
  timeout 40 .gpu/old/gpu_bench 1024 > /tmp/g/gb_old_$i.log 2>&1; echo "rc=$?" >> /tmp/g/gb_old_$i.log
  timeout 40 .gpu/gpu_bench 1024 > /tmp/g/gb_new_$i.log 2>&1; echo "rc=$?" >> /tmp/g/gb_new_$i.log
  [ $i = 1 ] && { timeout 60 python3 bench/torch_nccl.py 1024 > /tmp/g/torch.log 2>&1; echo "rc=$?" >> /tmp/g/torch.log; }
done
for b in old new; do
  x=.gpu/collectix; [ $b = old ] && x=.gpu/old/collectix
  timeout 30 $x bench --device cuda --ranks 1 --collective all_reduce -b 4 -e 1G -f 16 -n 5 > /tmp/g/cb1_$b.log 2>&1; echo "rc=$?" >> /tmp/g/cb1_$b.log
  timeout 30 $x bench --device cuda --ranks 4 --collective all_reduce -b 4 -e 256M -f 16 -n 5 > /tmp/g/cb4_$b.log 2>&1; echo "rc=$?" >> /tmp/g/cb4_$b.log
done
grep -h "per call" /tmp/g/gb_*.log /tmp/g/torch.log
[ -n "${OUT:-}" ] && tar czf "$OUT/g.tgz" -C /tmp g
true
