#!/usr/bin/env bash
# The copy bound of this host: how fast one core, and both cores at once, move 64 MiB
# (memcpy, pages faulted in beforehand). A broadcast or an all_gather between processes that
# each own their output must write every byte a process receives into that process's memory;
# with every core copying at once, the fastest any design can do is the received bytes over the
# aggregate rate printed here (docs/performance.md, "The copy bound").
# Usage: bash bench/copy_bound.sh [MiB] [rounds]
set -euo pipefail
mib=${1:-64}
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
src="$here/../../shared/bench/peers/memcpy_bw.c"
[ -f "$src" ] || src="$here/../shared/bench/peers/memcpy_bw.c"
bin=$(mktemp -d)/memcpy_bw
gcc -O3 -march=native -o "$bin" "$src"
cores=$(nproc)
for r in $(seq "$rounds"); do
  one=$(taskset -c 0 "$bin" "$mib" 30 | awk '/^memcpy/ {print $8}')
  all=0
  outs=$(for c in $(seq 0 $((cores - 1))); do taskset -c "$c" "$bin" "$mib" 30 | awk '/^memcpy/ {print $8}' & done; wait)
  all=$(echo "$outs" | awk '{s += $1} END {printf "%.2f", s}')
  echo "round $r: one core $one GB/s; $cores cores at once, together $all GB/s (each: $(echo $outs))"
done
