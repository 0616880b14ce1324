#!/usr/bin/env bash
# Device run 3 (session 22): the output bin (pool.rs), tests first, then old/new/torch.
set -u; mkdir -p /tmp/g; cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/g/smi.txt 2>&1; date -u >> /tmp/g/smi.txt
(timeout 60 .gpu/cuda_local_tests --test-threads=1 > /tmp/g/local.log 2>&1; echo rc=$? >> /tmp/g/local.log)
(timeout 80 .gpu/cuda_tests --test-threads=1 --skip what_nccl_lacks > /tmp/g/cuda.log 2>&1; echo rc=$? >> /tmp/g/cuda.log)
(timeout 20 .gpu/old/cuda_tests --exact what_nccl_lacks_is_a_clear_error > /tmp/g/lacks_old.log 2>&1; echo rc=$? >> /tmp/g/lacks_old.log)
(timeout 20 .gpu/cuda_tests --exact what_nccl_lacks_is_a_clear_error > /tmp/g/lacks_new.log 2>&1; echo rc=$? >> /tmp/g/lacks_new.log)
grep -hE "test result|rc=|FAILED|panicked" /tmp/g/local.log /tmp/g/cuda.log /tmp/g/lacks_*.log | head -20
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
grep -h "per call" /tmp/g/gb_*.log /tmp/g/torch.log | head -4
[ -n "${OUT:-}" ] && tar czf "$OUT/g3.tgz" -C /tmp g
true
