#!/usr/bin/env python3
"""Summarises a before/after comparison made of alternating `side_by_side.py` runs.

    python3 bench/peers/ab_summary.py FOLDER BEFORE AFTER

BEFORE and AFTER are globs, under FOLDER, of the runs' output folders (each holding a
`compare.json`), e.g. `runs/shm-base-*` and `runs/shm-cur-*`. Prints one markdown row per
cell: collectix's median with its range, before and after, their ratio, and the median of the
peer (Open MPI) measured in the same runs.
"""
import argparse
import collections
import glob
import json
import os
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--label", default="shm")
    a = ap.parse_args()
    cells = collections.defaultdict(lambda: {"base": [], "cur": [], "mpi": []})
    for side, pattern in (("base", a.before), ("cur", a.after)):
        files = sorted(glob.glob(os.path.join(a.folder, pattern, "compare.json")))
        if not files:
            raise SystemExit(f"no {pattern}/compare.json under {a.folder}")
        for f in files:
            with open(f) as fh:
                rows = json.load(fh)["rows"]
            for r in rows:
                k = (r["collective"], r["ranks"], r.get("size") or r.get("bytes"))
                cells[k][side].append(r["collectix_us"])
                cells[k]["mpi"].append(r["mpi_us"])
    runs = len(next(iter(cells.values()))["base"])
    print(f"{a.label}: collectix µs, median of {runs} alternating runs (min–max); "
          "Open MPI µs in the same runs")
    print("| collective | W | size | before | after | after/before | Open MPI |")
    print("|---|---|---|---|---|---|---|")
    for k, c in sorted(cells.items(), key=lambda x: (x[0][1], x[0][0], str(x[0][2]))):
        o, n = c["base"], c["cur"]
        m = statistics.median(c["mpi"])
        mo, mn = statistics.median(o), statistics.median(n)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {mo:.2f} ({min(o):.2f}–{max(o):.2f}) | "
              f"{mn:.2f} ({min(n):.2f}–{max(n):.2f}) | {mn / mo:.2f} | {m:.2f} |")


if __name__ == "__main__":
    main()
