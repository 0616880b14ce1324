#!/usr/bin/env python3
"""Regenerates the rows of the algorithm table (runtime/src/collective/select.rs).

For each collective the table covers, each world size (2 and 4 by default) and each algorithm
that can run it, runs `collectix bench` over an in-process world, or with `--transport tcp`
over one process per rank on this host (rows for `Host`, printed, never written: the `Host`
rows in select.rs are copied by hand where a sweep shows a clear winner) (sizes 4 B to 64 MiB,
every output checked; three rounds in alternating order, the median per size), takes the fastest
algorithm at each size (within 10%, the previous size's choice stays), and prints the table rows: a
run of sizes won by one algorithm becomes one row, whose bound is the largest size it won
(in the selection's unit: bytes of one rank's input). The largest W measured also covers
larger groups.

    cargo build --release -p collectix-cli
    python3 bench/tune.py                 # prints the rows
    python3 bench/tune.py --write         # and writes them into select.rs
    python3 bench/tune.py --out DIR       # keeps each run's raw table in DIR
    python3 bench/tune.py --source DIR    # the rows from tables kept earlier, no runs
    python3 bench/tune.py --transport tcp # rows over TCP loopback (printed, never written)
    python3 bench/tune.py --collectives reduce --write  # re-measures one collective's rows

The table in select.rs was written by `python3 bench/tune.py -n 10 --out
bench/results/2026-11-23-tune --write` (raw tables there); its reduce rows were re-measured
when the split reduce came, by `python3 bench/tune.py --collectives reduce -n 10 --out
bench/results/2026-11-24-tune-reduce --write`, its barrier rows added by `python3
bench/tune.py --collectives barrier -n 10 --out bench/results/2026-11-24-tune-barrier
--write`, and its all_reduce rows re-measured with reduce_broadcast by `python3
bench/tune.py --collectives all_reduce -n 10 --out bench/results/2026-11-24-tune-all_reduce
--write`. Its Host rows come from `python3 bench/tune.py --transport tcp --collectives
barrier,all_reduce -e 1M -n 20 --out bench/results/2026-11-24-tune-tcp-session11`.

Run it on a quiet machine: each choice is one run's medians. Standard library only.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SELECT = os.path.join(ROOT, "runtime", "src", "collective", "select.rs")

# Collective (bench name) -> (table constant, algorithms that can run it, whether the bench's
# size is the whole output gathered from W ranks, so one rank's input is size / W).
COLLECTIVES = {
    "all_reduce": ("ALL_REDUCE", ["ring", "halving_doubling", "recursive_doubling", "direct",
                                  "reduce_broadcast"], False),
    "broadcast": ("BROADCAST", ["binomial_tree", "direct"], False),
    "reduce": ("REDUCE", ["binomial_tree", "direct", "reduce_scatter_gather"], False),
    "all_gather": ("ALL_GATHER", ["ring", "direct"], True),
    "reduce_scatter": ("REDUCE_SCATTER", ["ring", "direct"], False),
    "barrier": ("BARRIER", ["dissemination", "direct"], False),
}

RUST_NAME = {
    "ring": "Ring",
    "halving_doubling": "HalvingDoubling",
    "recursive_doubling": "RecursiveDoubling",
    "binomial_tree": "BinomialTree",
    "direct": "Direct",
    "reduce_scatter_gather": "ReduceScatterGather",
    "dissemination": "Dissemination",
    "reduce_broadcast": "ReduceBroadcast",
}

# Algorithms this close to the fastest at a size count as tied with it.
MARGIN = 0.10

ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s+\S+\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\S+)\s*$")


def parse(text, what):
    """{size: median µs} from a bench table; exits on a wrong element."""
    times = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        size, t, wrong = int(m.group(1)), float(m.group(3)), m.group(4)
        if wrong not in ("0", "N/A"):
            sys.exit(f"{what}: {wrong} wrong elements at {size} B")
        times[size] = t
    if not times:
        sys.exit(f"{what} printed no rows:\n{text}")
    return times


def run(binary, coll, w, alg, args, rnd):
    name = f"{coll}-w{w}-{alg}" + (f"-r{rnd}" if rnd else "")
    if args.source:
        path = os.path.join(args.source, name + ".txt")
        with open(path) as f:
            return parse(f.read(), path)
    cmd = [
        binary, "bench", "--transport", args.transport, "--collective", coll, "--ranks", str(w),
        "--algorithm", alg,
        "-b", args.minbytes, "-e", args.maxbytes, "-f", str(args.stepfactor), "-n", str(args.iters),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    if args.out:
        with open(os.path.join(args.out, name + ".txt"), "w") as f:
            f.write(" ".join(cmd) + "\n" + out.stdout)
    return parse(out.stdout, " ".join(cmd))


def bound(n):
    """A byte count as the table writes it."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} * M"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} * K"
    return str(n)


def rows_for(coll, w, max_w, results, gathered, locality):
    """The table rows of one collective and W from {alg: {size: us}}."""
    sizes = sorted(set.intersection(*(set(t) for t in results.values())))
    # Algorithms within MARGIN of the fastest tie (identical schedules, such as a tree and
    # a direct broadcast over 2 ranks, differ only by noise): a tie keeps the previous
    # size's choice, and the first size takes the one that wins most sizes outright.
    fastest = {s: min(results, key=lambda a: results[a][s]) for s in sizes}
    wins = {a: sum(1 for s in sizes if fastest[s] == a) for a in results}
    best = []
    for s in sizes:
        t = results[fastest[s]][s]
        near = [a for a in results if results[a][s] <= t * (1 + MARGIN)]
        prev = best[-1][1] if best else None
        pick = prev if prev in near else max(near, key=lambda a: (wins[a], -results[a][s]))
        best.append((s, pick))
    runs = []  # [alg, largest size it won]
    for s, a in best:
        if runs and runs[-1][0] == a:
            runs[-1][1] = s
        else:
            runs.append([a, s])
    const = COLLECTIVES[coll][0]
    out = []
    for i, (a, s) in enumerate(runs):
        last = i == len(runs) - 1
        per_rank = s // w if gathered else s
        b = "ANY" if last else bound(per_rank)
        mw = "ANY" if max_w is None else str(max_w)
        out.append(f"    row({locality}, {const}, {mw}, {b}, {RUST_NAME[a]}),")
    return out, best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "collectix"))
    p.add_argument("--ranks", default="2,4", help="world sizes, comma-separated")
    p.add_argument("-b", "--minbytes", default="4")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3, help="runs per algorithm; the median per size")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--transport", default="local", choices=["local", "tcp"],
                   help="local: the in-process (Process) rows; tcp: the rows for processes of one host (Host)")
    p.add_argument("--out", help="directory for each run's raw table")
    p.add_argument("--source", help="read the raw tables kept by an earlier --out instead of running")
    p.add_argument("--write", action="store_true", help="write the rows into select.rs")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help="which collectives, comma-separated; --write replaces only their rows")
    args = p.parse_args()
    if not args.source and not os.access(args.bin, os.X_OK):
        sys.exit(f"no {args.bin}: cargo build --release -p collectix-cli")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    ws = sorted(int(x) for x in args.ranks.split(","))
    chosen = [c.strip() for c in args.collectives.split(",") if c.strip()]
    for c in chosen:
        if c not in COLLECTIVES:
            sys.exit(f"--collectives: no {c!r}; one of {', '.join(COLLECTIVES)}")
    rows_of = {}
    for coll in chosen:
        _, algs, gathered = COLLECTIVES[coll]
        lines = rows_of.setdefault(coll, [])
        for w in ws:
            rounds = {alg: [] for alg in algs}
            for rnd in range(args.rounds):
                # Alternate the order, so that a drift of the machine's load hits every one.
                for alg in algs if rnd % 2 == 0 else reversed(algs):
                    print(f"# {coll} W={w} {alg} round {rnd}", file=sys.stderr)
                    rounds[alg].append(run(args.bin, coll, w, alg, args, rnd))
            results = {
                alg: {
                    size: statistics.median(r[size] for r in rs)
                    for size in set.intersection(*(set(r) for r in rs))
                }
                for alg, rs in rounds.items()
            }
            locality = "Host" if args.transport == "tcp" else "Process"
            rows, best = rows_for(coll, w, None if w == ws[-1] else w, results, gathered, locality)
            lines += rows
            summary = ", ".join(f"{s}:{a}" for s, a in best)
            print(f"# {coll} W={w}: {summary}", file=sys.stderr)
    text = "\n".join(line for coll in chosen for line in rows_of[coll])
    print(text)
    if args.write and args.transport == "tcp":
        print("# not written: copy the Host rows a sweep shows clear winners for into select.rs "
              "by hand (a sweep over part of the sizes would cut the table short)", file=sys.stderr)
    elif args.write:
        with open(SELECT) as f:
            src = f.read()
        begin = "    // BEGIN GENERATED by bench/tune.py\n"
        end = "    // END GENERATED\n"
        i, j = src.index(begin) + len(begin), src.index(end)
        # The rows of the collectives not measured now stay as they are, in the table's order.
        kept = {coll: [] for coll in COLLECTIVES}
        for line in src[i:j].splitlines():
            const = re.search(r"row\(\w+, (\w+),", line)
            for coll, (c, _, _) in COLLECTIVES.items():
                if const and const.group(1) == c:
                    kept[coll].append(line)
        rows = [line for coll in COLLECTIVES
                for line in (rows_of[coll] if coll in rows_of else kept[coll])]
        with open(SELECT, "w") as f:
            f.write(src[:i] + "\n".join(rows) + "\n" + src[j:])
        print(f"# wrote {SELECT}", file=sys.stderr)


if __name__ == "__main__":
    main()
