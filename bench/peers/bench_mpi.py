#!/usr/bin/env python3
"""MPI (mpi4py + numpy) collective benchmark; same method and table as
bench_torch_gloo.py.  Run under mpirun, e.g.

  mpirun --allow-run-as-root --oversubscribe -np 2 python3 bench_mpi.py
  mpirun --allow-run-as-root --oversubscribe -np 4 \
         --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
         python3 bench_mpi.py --label mpi-tcp

One sample = Barrier; time K back-to-back ops; divide by K; MAX over ranks.
Reported: median over --iters (default 20) samples.  K ("reps") is calibrated
per op/size after warm-up so a sample lasts ~--sample-ms (5 ms; 20 ms for the
latency rows), 1 <= K <= 1000 (2000 for latency).

Size convention (nccl-tests, and `collectix bench`'s): "bytes" = S
  Allreduce            : S-byte float32 buffer per rank (separate send/recv)
  Bcast                : S bytes from root 0
  Reduce               : S bytes per rank, reduced to root 0
  Allgather            : S bytes of output per rank; each rank sends S/W
  Reduce_scatter_block : S bytes of input per rank; each rank receives S/W
  Gather               : S bytes gathered at root 0; each rank sends S/W
  Scatter              : S bytes at root 0; each rank receives S/W
  Alltoall             : S bytes in and out per rank; S/W to each rank
  Sendrecv (send_recv) : each rank sends S bytes to rank+1 and receives S from rank-1
  algbw = S / t;  busbw = algbw * f
  f = 2(W-1)/W (Allreduce), (W-1)/W (Allgather, Reduce_scatter_block, Gather,
  Scatter, Alltoall), 1 (Bcast, Reduce, Sendrecv)
(This copy extends ../shared/bench/peers/bench_mpi.py, which has the first four, to every
collective both MPI and collectix have; `--ops` picks.)
Plus: latency of Allreduce of one float32 (4 bytes) and Barrier (same method),
and the per-op time distribution of 1000 consecutive Allreduce calls of 4 B and
4 KiB without barriers ("# per-op" lines).
"""
import argparse
import statistics
import sys

import numpy as np
from mpi4py import MPI

KiB, MiB = 1024, 1024 * 1024
DEFAULT_SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather",
       "scatter", "all_to_all", "send_recv"]
IMPL = {"all_reduce": "Allreduce", "broadcast": "Bcast", "reduce": "Reduce",
        "all_gather": "Allgather", "reduce_scatter": "Reduce_scatter_block",
        "gather": "Gather", "scatter": "Scatter", "all_to_all": "Alltoall",
        "send_recv": "Sendrecv"}


def busbw_factor(op, w):
    if op == "all_reduce":
        return 2.0 * (w - 1) / w
    if op in ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all"):
        return (w - 1) / w
    return 1.0


def calibrate(comm, fn, target_s, max_reps):
    """Ops per timed sample so one sample lasts ~target_s (same on all ranks)."""
    t0 = MPI.Wtime()
    for _ in range(3):
        fn()
    per_op = comm.allreduce((MPI.Wtime() - t0) / 3, op=MPI.MAX)
    return max(1, min(max_reps, int(target_s / max(per_op, 1e-9))))


def make_op(comm, op, nbytes):
    w, rank = comm.Get_size(), comm.Get_rank()
    n = nbytes // 4
    f32 = MPI.FLOAT
    if op == "all_reduce":
        a = np.ones(n, np.float32)
        b = np.empty(n, np.float32)
        return lambda: comm.Allreduce([a, f32], [b, f32], op=MPI.SUM)
    if op == "broadcast":
        a = np.ones(n, np.float32)
        return lambda: comm.Bcast([a, f32], root=0)
    if op == "all_gather":
        a = np.full(n // w, rank, np.float32)
        b = np.empty(n, np.float32)
        return lambda: comm.Allgather([a, f32], [b, f32])
    if op == "reduce_scatter":
        a = np.ones(n, np.float32)
        b = np.empty(n // w, np.float32)
        return lambda: comm.Reduce_scatter_block([a, f32], [b, f32], op=MPI.SUM)
    if op == "reduce":
        a = np.ones(n, np.float32)
        b = np.empty(n, np.float32)
        return lambda: comm.Reduce([a, f32], [b, f32], op=MPI.SUM, root=0)
    if op == "gather":
        a = np.full(n // w, rank, np.float32)
        b = np.empty(n, np.float32) if rank == 0 else None
        return lambda: comm.Gather([a, f32], [b, f32] if rank == 0 else None, root=0)
    if op == "scatter":
        a = np.ones(n, np.float32) if rank == 0 else None
        b = np.empty(n // w, np.float32)
        return lambda: comm.Scatter([a, f32] if rank == 0 else None, [b, f32], root=0)
    if op == "all_to_all":
        a = np.ones(n, np.float32)
        b = np.empty(n, np.float32)
        return lambda: comm.Alltoall([a, f32], [b, f32])
    if op == "send_recv":
        a = np.ones(n, np.float32)
        b = np.empty(n, np.float32)
        dst, src = (rank + 1) % w, (rank - 1) % w
        return lambda: comm.Sendrecv([a, f32], dst, 0, [b, f32], src, 0)
    raise ValueError(op)


def time_samples(comm, fn, iters, warmup, target_s, max_reps):
    for _ in range(warmup):
        fn()
    reps = calibrate(comm, fn, target_s, max_reps)
    ts = np.empty(iters, np.float64)
    for i in range(iters):
        comm.Barrier()
        t0 = MPI.Wtime()
        for _ in range(reps):
            fn()
        ts[i] = (MPI.Wtime() - t0) / reps
    out = np.empty_like(ts)
    comm.Allreduce(ts, out, op=MPI.MAX)  # slowest rank per sample
    return out.tolist(), reps


def fmt_bytes(b):
    if b >= MiB and b % MiB == 0:
        return f"{b // MiB}MiB"
    if b >= KiB and b % KiB == 0:
        return f"{b // KiB}KiB"
    return f"{b}B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--iters", type=int, default=20, help="timed samples (median reported)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sample-ms", type=float, default=5.0,
                    help="target duration of one sample; sets ops per sample (1..1000)")
    ap.add_argument("--lat-sample-ms", type=float, default=20.0)
    ap.add_argument("--per-op", type=int, default=1000,
                    help="ops for the per-op Allreduce time distribution (4 B and 4 KiB)")
    ap.add_argument("--label", default="mpi")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--no-header", action="store_true")
    args = ap.parse_args()

    comm = MPI.COMM_WORLD
    w, rank = comm.Get_size(), comm.Get_rank()
    rows = []
    blocked = ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all")
    for op in args.ops:
        for s in args.sizes:
            if s % 4 or (op in blocked and (s // 4) % w):
                # Not whole float32 blocks per rank: skipped, as `collectix bench` does.
                continue
            fn = make_op(comm, op, s)
            rows.append((op, IMPL[op], s) + time_samples(comm, fn, args.iters, args.warmup,
                                                         args.sample_ms / 1e3, 1000))
    one, res = np.ones(1, np.float32), np.empty(1, np.float32)
    lat = args.lat_sample_ms / 1e3
    rows.append(("lat_all_reduce_4B", "Allreduce", 4) + time_samples(
        comm, lambda: comm.Allreduce([one, MPI.FLOAT], [res, MPI.FLOAT], op=MPI.SUM),
        args.iters, 20, lat, 2000))
    rows.append(("lat_barrier", "Barrier", 0) + time_samples(comm, comm.Barrier, args.iters, 20, lat, 2000))
    perop = []
    for nbytes in ((4, 4 * KiB) if args.per_op > 0 else ()):
        a = np.ones(nbytes // 4, np.float32)
        b = np.empty_like(a)
        for _ in range(20):
            comm.Allreduce([a, MPI.FLOAT], [b, MPI.FLOAT], op=MPI.SUM)
        comm.Barrier()
        ts = []
        for _ in range(args.per_op):
            t0 = MPI.Wtime()
            comm.Allreduce([a, MPI.FLOAT], [b, MPI.FLOAT], op=MPI.SUM)
            ts.append(MPI.Wtime() - t0)
        perop.append((nbytes, ts))
    if rank != 0:
        return
    if not args.no_header:
        libver = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
        print(f"# {args.label}: {libver}, "
              f"mpi4py {__import__('mpi4py').__version__}, numpy {np.__version__}, "
              f"python {sys.version.split()[0]}, iters={args.iters} warmup={args.warmup}")
        print(f"{'op':<18} {'impl':<22} {'W':>2} {'bytes':>7} {'median_us':>11} "
              f"{'min_us':>10} {'max_us':>10} {'reps':>5} {'algbw_GB/s':>10} {'busbw_GB/s':>10}")
    csv = open(args.csv, "a") if args.csv else None
    if csv and csv.tell() == 0:
        csv.write("label,op,impl,world,bytes,median_us,min_us,max_us,reps,algbw_GBps,busbw_GBps\n")
    for op, impl, s, ts, reps in rows:
        med = statistics.median(ts)
        if op.startswith("lat_"):
            alg = bus = float("nan")
        else:
            alg = s / med / 1e9
            bus = alg * busbw_factor(op, w)
        print(f"{op:<18} {impl:<22} {w:>2} {fmt_bytes(s):>7} {med*1e6:>11.1f} "
              f"{min(ts)*1e6:>10.1f} {max(ts)*1e6:>10.1f} {reps:>5} {alg:>10.3f} {bus:>10.3f}", flush=True)
        if csv:
            csv.write(f"{args.label},{op},{impl},{w},{s},{med*1e6:.2f},{min(ts)*1e6:.2f},"
                      f"{max(ts)*1e6:.2f},{reps},{alg:.4f},{bus:.4f}\n")
    for nbytes, ts in perop:
        ts = sorted(ts)
        n = len(ts)
        q = lambda f: ts[min(n - 1, int(n * f))] * 1e6
        print(f"# per-op {args.label} Allreduce {nbytes}B W={w} (rank 0, {n} consecutive ops, no barrier): "
              f"p10 {q(.1):.1f} p50 {q(.5):.1f} p90 {q(.9):.1f} p99 {q(.99):.1f} us, "
              f"mean {sum(ts) / n * 1e6:.1f} us, >1ms: {sum(1 for x in ts if x > 1e-3)}", flush=True)
    if csv:
        csv.close()


if __name__ == "__main__":
    main()
