#!/usr/bin/env bash
# Device run 1 (session 22): the out-of-place cost, measured side by side with torch.
set -u; mkdir -p /tmp/g; cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv > /tmp/g/smi.txt 2>&1
which nsys ncu > /tmp/g/tools.txt 2>&1; python3 -c 'import torch;print(torch.__version__, torch.cuda.nccl.version())' >> /tmp/g/tools.txt 2>&1
timeout 100 .gpu/gpu_bench 1024 > /tmp/g/gb1.log 2>&1; echo "rc=$?" >> /tmp/g/gb1.log
timeout 100 python3 bench/torch_nccl.py 1024 > /tmp/g/torch1.log 2>&1; echo "rc=$?" >> /tmp/g/torch1.log
timeout 100 .gpu/gpu_bench 1024 > /tmp/g/gb2.log 2>&1; echo "rc=$?" >> /tmp/g/gb2.log
timeout 100 python3 bench/torch_nccl.py 1024 > /tmp/g/torch2.log 2>&1; echo "rc=$?" >> /tmp/g/torch2.log
timeout 60 .gpu/collectix bench --device cuda --ranks 1 --collective all_reduce -b 4 -e 1G -f 16 -n 10 > /tmp/g/cb1.log 2>&1; echo "rc=$?" >> /tmp/g/cb1.log
if command -v nsys >/dev/null; then
  timeout 120 nsys profile -o /tmp/g/prof --force-overwrite true -t cuda .gpu/gpu_bench 64 > /tmp/g/nsys_run.log 2>&1
  timeout 90 nsys stats -r cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum /tmp/g/prof.nsys-rep > /tmp/g/nsys_stats.txt 2>&1
  rm -f /tmp/g/prof.nsys-rep /tmp/g/prof.sqlite
fi
cat /tmp/g/smi.txt /tmp/g/tools.txt; grep -v "^#" /tmp/g/gb1.log | head -3; tail -5 /tmp/g/torch1.log
[ -n "${OUT:-}" ] && cp /tmp/g/* "$OUT"/ 2>/dev/null
true
