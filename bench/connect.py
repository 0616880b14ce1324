#!/usr/bin/env python3
"""Eager against lazy connection (issue 11): runs examples/multiprocess under
`collectix launch` with COLLECTIX_CONNECT=eager and =lazy, for each process count, several
times, and prints the medians:

- join: the slowest rank's `collectix::init` (from its start to its communicator);
- first: the slowest rank's first call, an all_reduce of 4 KiB (or with --first all_to_all,
  an all_to_all, which needs every pair connected); it includes waiting for the last rank
  to join;
- loop: the slowest rank's 100 all_reduces, less its first;
- threads: a process's threads at the end (the median rank; 2 per connection, plus 4);
- wall: the whole job, from the launcher's start to its exit.

Build first, in release:
    cargo build --release -p collectix-cli --bin collectix
    cargo build --release -p collectix --example multiprocess
then: python3 bench/connect.py [--procs 32 64] [--repeats 3]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(mode, n, port, iters, first):
    env = dict(os.environ, COLLECTIX_CONNECT=mode, ITERS=str(iters), FIRST=first)
    start = time.monotonic()
    out = subprocess.run(
        [
            os.path.join(ROOT, "target/release/collectix"),
            "launch",
            "--nproc-per-node",
            str(n),
            "--master-port",
            str(port),
            "--",
            os.path.join(ROOT, "target/release/examples/multiprocess"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - start
    if out.returncode != 0:
        sys.exit(f"{mode} {n}: the job failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    joins = [float(m) for m in re.findall(r"joined in ([0-9.]+) ms", out.stdout)]
    ends = re.findall(
        r"ok \d+ in ([0-9.]+) ms \(first ([0-9.]+) ms\), (\d+) threads", out.stdout
    )
    if len(joins) != n or len(ends) != n:
        sys.exit(f"{mode} {n}: {len(joins)} joins, {len(ends)} ends of {n}")
    loops = [float(a) - float(b) for a, b, _ in ends]
    firsts = [float(b) for _, b, _ in ends]
    threads = [int(t) for _, _, t in ends]  # rank 0 also serves the store: the median is a peer
    return {
        "join": max(joins),
        "first": max(firsts),
        "loop": max(loops),
        "threads": statistics.median(threads),
        "wall": wall * 1e3,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--port", type=int, default=29_611)
    ap.add_argument("--first", default="all_reduce", choices=["all_reduce", "all_to_all"])
    a = ap.parse_args()
    print(f"First call: {a.first}; {a.repeats} runs, medians.\n")
    print("| processes | connect | join ms | first call ms | 100 calls ms | threads/process | job wall ms |")
    print("|---|---|---|---|---|---|---|")
    for n in a.procs:
        for mode in ["eager", "lazy"]:
            rows = [run(mode, n, a.port, a.iters, a.first) for _ in range(a.repeats)]
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            print(
                f"| {n} | {mode} | {med['join']:.0f} | {med['first']:.0f} | "
                f"{med['loop']:.0f} | {med['threads']:.0f} | {med['wall']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
