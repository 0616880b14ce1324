#!/usr/bin/env bash
# Device run 2 (session 22): the copy kernel against the copy engine, tests first.
set -u; mkdir -p /tmp/g; cd "$(dirname "$0")/.."
(timeout 150 .gpu/cuda_local_tests --test-threads=1 > /tmp/g/local.log 2>&1; echo rc=$? >> /tmp/g/local.log)
(timeout 120 .gpu/cuda_tests --test-threads=1 > /tmp/g/cuda.log 2>&1; echo rc=$? >> /tmp/g/cuda.log)
grep -hE "test result|rc=|FAILED|panicked" /tmp/g/local.log /tmp/g/cuda.log | head -20
for i in 1 2; do
  timeout 60 .gpu/gpu_bench 1024 > /tmp/g/gb_kernel_$i.log 2>&1; echo "rc=$?" >> /tmp/g/gb_kernel_$i.log
  COLLECTIX_D2D_COPY=engine timeout 60 .gpu/gpu_bench 1024 > /tmp/g/gb_engine_$i.log 2>&1; echo "rc=$?" >> /tmp/g/gb_engine_$i.log
done
timeout 90 python3 bench/torch_nccl.py 1024 > /tmp/g/torch.log 2>&1; echo "rc=$?" >> /tmp/g/torch.log
for m in kernel engine; do
  COLLECTIX_D2D_COPY=$m timeout 40 .gpu/collectix bench --device cuda --ranks 1 --collective all_reduce -b 4 -e 1G -f 16 -n 5 > /tmp/g/cb1_$m.log 2>&1; echo "rc=$?" >> /tmp/g/cb1_$m.log
  for c in broadcast all_gather; do
    COLLECTIX_D2D_COPY=$m timeout 40 .gpu/collectix bench --device cuda --ranks 4 --collective $c -b 4K -e 256M -f 16 -n 5 > /tmp/g/l4_${c}_$m.log 2>&1; echo "rc=$?" >> /tmp/g/l4_${c}_$m.log
  done
done
[ -n "${OUT:-}" ] && cp /tmp/g/* "$OUT"/ 2>/dev/null
true
