#!/usr/bin/env python3
"""collectix and its peers (Open MPI; torch.distributed on Gloo with --peers mpi gloo) side
by side, in one run, alternately; prints a comparison table with ratios and keeps every
tool's raw output.

  python3 bench/peers/side_by_side.py                       # W=2,4; 4 B, 1 MiB, 16 MiB, 64 MiB
  python3 bench/peers/side_by_side.py --ranks 2 --sizes 1M --collectives all_reduce --rounds 1
  python3 bench/peers/side_by_side.py --peers mpi gloo      # torch.distributed on Gloo too
  python3 bench/peers/side_by_side.py --transport tcp --peers mpi gloo   # TCP between processes
  python3 bench/peers/side_by_side.py --transport shm      # processes over shared memory

Every later performance claim of collectix comes from this script (issue 10). What it runs:
- `collectix bench` (target/release/collectix; built if missing): the in-process world, or
  with `--transport tcp` one process per rank over TCP loopback, or with `--transport shm`
  one process per rank over shared memory (TCP beside it for loss); one invocation per (ranks,
  collective, size), `-n ITERS`, with its correctness check on; in one process its ranks'
  threads are bound to cores when the cores suffice (`--bind auto`), as `mpirun` binds its
  processes (to cores for 2 ranks, to the socket for more);
- `bench_mpi.py` under `mpirun`, one `mpirun` per ranks value, every collective and size at
  once: over shared memory (its default ob1 + vader on one host), or with `--transport tcp`
  restricted to TCP on loopback (`--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include
  lo`);
- with `--peers gloo`, `bench_torch_gloo.py`: torch.distributed on Gloo (TCP on loopback).
Rounds alternate the order (collectix first, then MPI first, ...), so that a drift of the
machine's load over the run hits both. Both use the same method: a sample is the slowest
rank's time for K back-to-back blocking calls after a barrier, K calibrated so a sample lasts
about 5 ms; the figure is the median over ITERS samples; per cell, the median over rounds.
Sizes follow nccl-tests (for all_gather, gather and all_to_all the gathered size; for
reduce_scatter and scatter the full input), in float32; sizes that do not split into the ranks
are skipped by both.

Output: OUT (default /tmp/collectix-side-by-side/<UTC stamp>/): raw/ (every invocation's
stdout, collectix's --json rows, MPI's CSV), compare.md (the table), compare.json, mpi_W*.json
(MPI's rows in collectix's --json format) and plot_<collective>.svg (busbw against size, both
tools, every W; drawn by `collectix plot`).

Needs: mpirun and mpi4py + numpy for /usr/bin/python3 (Debian: openmpi-bin python3-mpi4py
python3-numpy; `--install` runs apt-get for them).
"""
import argparse
import csv
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BOTH = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather",
        "scatter", "all_to_all", "send_recv", "barrier"]
PY = "/usr/bin/python3"


def parse_size(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(s[:-1] if mult > 1 else s) * mult


def fmt_size(b):
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"


def run(cmd, log, timeout):
    """Runs cmd, its stdout to `log` (and stderr beside it); False if it failed."""
    with open(log, "w") as out, open(log + ".err", "w") as err:
        try:
            p = subprocess.run(cmd, stdout=out, stderr=err, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            print(f"  timed out: {' '.join(cmd)}", flush=True)
            return False
    if p.returncode != 0:
        why = skipped(log)
        if why:
            print(f"  skipped: {' '.join(cmd)}: {why}", flush=True)
        else:
            print(f"  failed ({p.returncode}): {' '.join(cmd)} (see {log}.err)", flush=True)
    return p.returncode == 0


def skipped(log):
    """Why a `collectix bench` run measured nothing because none of its sizes splits into the
    ranks (a 4 B all_gather of 2 ranks: it says so, and exits 1 since nothing was measured);
    None for any other failure."""
    try:
        with open(log + ".err") as f:
            if "every size was skipped" not in f.read():
                return None
        with open(log) as f:
            whys = [l[2:].strip() for l in f if l.startswith("# ") and " skipped: " in l]
    except OSError:
        return None
    return "; ".join(whys) or "every size was skipped"


def collectix_round(args, exe, w, r, raw):
    """One round of collectix: every (collective, size) for `w` ranks. Rows by (coll, size)."""
    rows = {}
    for coll in args.collectives:
        sizes = [4] if coll == "barrier" else args.sizes
        for s in sizes:
            base = os.path.join(raw, f"collectix_W{w}_{coll}_{s}_r{r}")
            cmd = [exe, "bench", "--collective", coll, "--ranks", str(w), "-b", str(s),
                   "-e", str(s), "-n", str(args.iters), "-c", "1", "--json", base + ".json",
                   "--transport", args.transport]
            if not run(cmd, base + ".txt", args.timeout):
                continue
            with open(base + ".json") as f:
                for row in json.load(f):
                    if row.get("wrong"):
                        print(f"  WRONG results: {base}.txt", flush=True)
                    rows[(coll, s)] = row
    return rows


def read_peer_csv(path, label):
    """A peer script's CSV rows by (op, size); its barrier latency row as ("barrier", 4)."""
    rows = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["label"] != label or not row["median_us"]:
                continue  # another label, or UNSUPPORTED
            op, size = row["op"], int(row["bytes"])
            if op == "lat_barrier":
                op, size = "barrier", 4
            elif op.startswith("lat_"):
                continue
            rows[(op, size)] = {"time_us": float(row["median_us"]),
                                "busbw_gbs": float(row["busbw_GBps"]) if op != "barrier" else 0.0}
    return rows


def gloo_round(args, w, r, raw):
    """One round of torch.distributed on Gloo for `w` ranks (one spawn of W processes)."""
    base = os.path.join(raw, f"gloo_W{w}_r{r}")
    ops = [c for c in args.collectives if c != "barrier"]
    cmd = [PY, os.path.join(HERE, "bench_torch_gloo.py"), "--label", "torch-gloo",
           "--worlds", str(w), "--iters", str(args.iters), "--per-op", "0",
           "--port", str(29600 + 10 * r + w), "--csv", base + ".csv",
           "--sizes"] + [str(s) for s in args.sizes]
    cmd += ["--ops"] + ops if ops else []
    if not run(cmd, base + ".txt", args.timeout * 20):
        return {}
    return read_peer_csv(base + ".csv", "torch-gloo")


def mpi_round(args, w, r, raw):
    """One round of Open MPI for `w` ranks: every collective and size in one mpirun."""
    base = os.path.join(raw, f"mpi_W{w}_r{r}")
    ops = [c for c in args.collectives if c != "barrier"]
    label = "mpi-" + ("tcp" if args.transport == "tcp" else "shm")
    mca = (["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
           if args.transport == "tcp" else [])
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(w)] + mca + [PY,
           os.path.join(HERE, "bench_mpi.py"), "--label", label, "--iters", str(args.iters),
           "--per-op", "0", "--csv", base + ".csv", "--sizes"] + [str(s) for s in args.sizes]
    cmd += ["--ops"] + ops if ops else []
    if not run(cmd, base + ".txt", args.timeout * 20):
        return {}
    return read_peer_csv(base + ".csv", label)


def median_of(samples, key):
    vals = [s[key] for s in samples if s.get(key) is not None]
    return statistics.median(vals) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", nargs="+", default=["4", "1M", "16M", "64M"])
    ap.add_argument("--collectives", nargs="+", default=BOTH, choices=BOTH)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--transport", default="local", choices=["local", "tcp", "shm"],
                    help="tcp: collectix and Open MPI between processes over TCP loopback; "
                         "shm: collectix's processes over shared memory, against Open MPI's")
    ap.add_argument("--iters", type=int, default=10, help="samples per cell (median)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per collectix invocation")
    ap.add_argument("--out", default=None)
    ap.add_argument("--collectix", default=os.path.join(ROOT, "target", "release", "collectix"))
    ap.add_argument("--peers", nargs="+", default=["mpi"], choices=["mpi", "gloo"],
                    help="gloo: torch.distributed on Gloo (Debian python3-torch), slower to run")
    ap.add_argument("--install", action="store_true",
                    help="apt-get Open MPI, mpi4py (and python3-torch with --peers gloo) if missing")
    args = ap.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes]

    pkgs = ["openmpi-bin", "libopenmpi-dev", "python3-mpi4py", "python3-numpy"]
    probe = "import mpi4py, numpy"
    if "gloo" in args.peers:
        pkgs.append("python3-torch")
        probe += ", torch"
    have = shutil.which("mpirun") is not None and subprocess.run(
        [PY, "-c", probe], capture_output=True).returncode == 0
    if args.install and not have:
        subprocess.run(["apt-get", "update", "-q"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends"] + pkgs,
                       check=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    elif not have:
        sys.exit(f"missing peers: install {' '.join(pkgs)} (Debian) or pass --install")
    if not os.path.exists(args.collectix):
        subprocess.run(["cargo", "build", "--release", "-p", "collectix-cli"], cwd=ROOT, check=True)

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or os.path.join("/tmp/collectix-side-by-side", stamp)
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    versions = {
        "collectix": subprocess.run([args.collectix, "--version"], capture_output=True,
                                    text=True).stdout.strip(),
        "mpirun": subprocess.run(["mpirun", "--version"], capture_output=True,
                                 text=True).stdout.splitlines()[0],
        "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=ROOT).stdout.strip(),
        "nproc": os.cpu_count(),
    }
    print(f"# side by side: {versions}; out {out}", flush=True)

    tools = ["collectix"] + args.peers
    names = {"collectix": "collectix", "mpi": "Open MPI", "gloo": "torch Gloo"}
    rounds = {"collectix": lambda w, r: collectix_round(args, args.collectix, w, r, raw),
              "mpi": lambda w, r: mpi_round(args, w, r, raw),
              "gloo": lambda w, r: gloo_round(args, w, r, raw)}
    results = {t: {} for t in tools}  # tool -> (w, coll, size) -> [rows]
    for r in range(1, args.rounds + 1):
        # Alternate: each round starts with the tool after the one the last round started with.
        order = tools[(r - 1) % len(tools):] + tools[:(r - 1) % len(tools)]
        for w in args.ranks:
            for tool in order:
                print(f"round {r}, W={w}: {tool}", flush=True)
                for (coll, s), row in rounds[tool](w, r).items():
                    results[tool].setdefault((w, coll, s), []).append(row)

    table = []
    for w in args.ranks:
        for coll in args.collectives:
            for s in ([4] if coll == "barrier" else args.sizes):
                got = {t: results[t].get((w, coll, s), []) for t in tools}
                if not got["collectix"] or not any(got[p] for p in args.peers):
                    continue
                row = {"collective": coll, "ranks": w, "size": s}
                ct = median_of(got["collectix"], "time_us")
                for t in tools:
                    row[f"{t}_us"] = median_of(got[t], "time_us")
                    row[f"{t}_busbw"] = median_of(got[t], "busbw_gbs")
                    if t != "collectix":
                        pt = row[f"{t}_us"]
                        row[f"{t}_over_collectix"] = pt / ct if pt and ct else None
                table.append(row)

    peers_text = ", ".join(
        versions["mpirun"] + (" (TCP)" if args.transport == "tcp" else " (shared memory)")
        if p == "mpi" else "torch.distributed on Gloo (loopback TCP)"
        for p in args.peers)
    head = ["collective", "W", "size", "collectix (µs)"]
    for p in args.peers:
        head += [f"{names[p]} (µs)", f"ratio {names[p]}"]
    head += ["collectix busbw"] + [f"{names[p]} busbw" for p in args.peers]
    lines = [
        f"{versions['collectix']} (git {versions['git']}) against {peers_text}; "
        f"{versions['nproc']} cores; median of {args.iters} samples, then of {args.rounds} "
        f"alternating rounds. Ratio = the peer's time / collectix's (above 1: collectix is "
        f"faster). busbw in GB/s.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    num = lambda v, f: "—" if v is None else format(v, f)
    for t in table:
        barrier = t["collective"] == "barrier"
        cells = [t["collective"], str(t["ranks"]), "—" if barrier else fmt_size(t["size"]),
                 num(t["collectix_us"], ".1f")]
        for p in args.peers:
            cells += [num(t[f"{p}_us"], ".1f"), num(t[f"{p}_over_collectix"], ".2f")]
        cells += ["—" if barrier else num(t[f"{tl}_busbw"], ".3f") for tl in tools]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump({"versions": versions, "rows": table}, f, indent=1)

    # Each tool's medians in collectix's --json format, and the plots.
    label = {"collectix": "collectix" + {"tcp": " (tcp)", "shm": " (shm)"}.get(args.transport, ""),
             "mpi": "Open MPI (tcp)" if args.transport == "tcp" else "Open MPI (shm)",
             "gloo": "torch Gloo"}
    for tool in tools:
        for w in args.ranks:
            rows = [{"source": label[tool],
                     "collective": coll, "ranks": ww, "size": s,
                     "busbw_gbs": median_of(v, "busbw_gbs") or 0.0}
                    for (ww, coll, s), v in results[tool].items() if ww == w]
            with open(os.path.join(out, f"{tool}_W{w}.json"), "w") as f:
                json.dump(rows, f)
    for coll in args.collectives:
        if coll == "barrier":
            continue
        files = []
        for tool in tools:
            for w in args.ranks:
                rows = [x for x in json.load(open(os.path.join(out, f"{tool}_W{w}.json")))
                        if x["collective"] == coll]
                p = os.path.join(out, f"{tool}_W{w}_{coll}.json")
                with open(p, "w") as f:
                    json.dump(rows, f)
                files.append(p)
        where = {"tcp": "over TCP", "shm": "processes over shared memory"}.get(
            args.transport, "in-process")
        title = f"{coll}: collectix ({where}) and " + ", ".join(label[p] for p in args.peers)
        subprocess.run([args.collectix, "plot", "--out", os.path.join(out, f"plot_{coll}.svg"),
                        "--title", title] + files, check=False)
    print(f"# written: {out}/compare.md, compare.json, raw/, plot_*.svg")


if __name__ == "__main__":
    main()
