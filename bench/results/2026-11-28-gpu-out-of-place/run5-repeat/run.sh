#!/usr/bin/env bash
set -u; cd "$(dirname "$0")/.."; date -u
for i in 1 2 3; do for b in old new; do
  x=.gpu/collectix; [ $b = old ] && x=.gpu/old/collectix
  echo "== $b $i"; timeout 25 $x bench --device cuda --ranks 1 --collective all_reduce -b 16M -e 1G -f 4 -n 10 2>/dev/null | grep -E "^ +[0-9]+ " | awk '{print $1, $6, $7, $8}'
done; done
