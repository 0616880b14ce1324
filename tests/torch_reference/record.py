#!/usr/bin/env python3
"""Records the differential set: what torch.distributed (Gloo) gives on every rank for the
collectives of collectix's test cases, so that `tests/suite/torch_differential.rs` can check
collectix's outputs against torch's on every path without torch installed.

    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch numpy
    /tmp/torchenv/bin/python tests/torch_reference/record.py > tests/torch_reference/gloo.txt

The inputs are collectix's (`collectix_runtime::testing::input`, `Case::block`, `Case::a2a`;
`all_gather` and `all_to_all` with even blocks, the only ones Gloo takes):
rank r's input number `salt`, element i, is k = 7r + 13 salt + 3i, then 1 + k % 2 under a
product, k % 3 == 0 for bool, k % 5 for unsigned types and k % 5 - 2 for the others. Every
reduction order is exact, so outputs compare byte for byte.

Each line is one case: `kind w=W count=N dtype=D op=OP root=R :` then, for each rank, `rK=`
and its output: `-` (none), `?` (torch leaves it unspecified: a reduce's non-roots), or
tensors `SHAPE:FNV` joined by `,` (list outputs in brackets), where SHAPE is the dims
joined by `x` and FNV the 64-bit FNV-1a hash of the tensor's little-endian bytes, in hex
(a bool tensor's as 0 and 1: Gloo's bool sum leaves the integer sum in each byte).
A case torch refuses on Gloo is `... : unsupported ERROR`.
"""
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WS = [2, 3, 4]
COUNTS = [1, 5, 300]
DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i32": torch.int32,
    "i64": torch.int64,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}
UNSIGNED = {"u8"}
FLOATS = {"f32", "f64", "f16", "bf16"}
OPS = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}
REDUCING = ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"]
OTHERS = [
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
]


def ops_for(kind, dtype):
    """collectix's valid ops (`ReduceOp::check`) for a reducing kind; `sum` for the others."""
    if kind not in REDUCING:
        return ["sum"]
    ops = ["sum", "product", "min", "max"]
    if dtype in FLOATS:
        ops.append("avg")
    else:
        ops += ["band", "bor", "bxor"]
    return ops


def cases():
    for w in WS:
        for kind in REDUCING + OTHERS:
            for count in COUNTS:
                for dtype in DTYPES:
                    for op in ops_for(kind, dtype):
                        root = (count + w // 2) % w
                        yield (kind, w, count, dtype, op, root)


def inp(dtype, op, rank, salt, n):
    vals = []
    for i in range(n):
        k = rank * 7 + salt * 13 + i * 3
        if op == "product":
            v = 1 + k % 2
        elif dtype == "bool":
            v = int(k % 3 == 0)
        elif dtype in UNSIGNED:
            v = k % 5
        else:
            v = k % 5 - 2
        vals.append(v)
    t = torch.tensor(vals, dtype=torch.float64)
    return t.to(DTYPES[dtype])


def block(count, j):
    return count + j % 2


def a2a(count, r, j):
    return count + (r + 2 * j) % 3


def fnv(t):
    h = 0xCBF29CE484222325
    for b in t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes():
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def show(t):
    if t.dtype == torch.bool:
        # Gloo's bool sum leaves the integer sum in each byte (True with 2, 3, 4, ...);
        # collectix's is an OR, whose True is 1. Compared as booleans.
        t = t != 0
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    return f"{shape}:{fnv(t)}"


def run(kind, w, r, count, dtype, op, root):
    """This rank's output of one case: a tensor, a list of tensors, None, or '?'."""
    dt = DTYPES[dtype]
    o = OPS[op]
    if kind == "all_reduce":
        t = inp(dtype, op, r, 0, count)
        dist.all_reduce(t, op=o)
        return t
    if kind == "reduce":
        t = inp(dtype, op, r, 0, count)
        dist.reduce(t, dst=root, op=o)
        return t if r == root else "?"
    if kind == "broadcast":
        t = inp(dtype, op, r, 0, count) if r == root else torch.zeros(count, dtype=dt)
        dist.broadcast(t, src=root)
        return t
    if kind == "all_gather":
        # Even blocks: Gloo refuses blocks of different sizes (collectix takes them).
        outs = [torch.zeros(count, dtype=dt) for _ in range(w)]
        dist.all_gather(outs, inp(dtype, op, r, 0, count))
        return outs
    if kind == "all_gather_into_tensor":
        # Gloo takes only the concatenated form; torch documents the stacked one alike.
        out = torch.zeros(w * count, dtype=dt)
        dist.all_gather_into_tensor(out, inp(dtype, op, r, 0, count))
        return out.reshape(w, count)
    if kind == "gather":
        outs = [torch.zeros(count, dtype=dt) for _ in range(w)] if r == root else None
        dist.gather(inp(dtype, op, r, 0, count), gather_list=outs, dst=root)
        return outs
    if kind == "scatter":
        out = torch.zeros(count, dtype=dt)
        ins = [inp(dtype, op, r, j, count) for j in range(w)] if r == root else None
        dist.scatter(out, scatter_list=ins, src=root)
        return out
    if kind == "reduce_scatter":
        out = torch.zeros(block(count, r), dtype=dt)
        dist.reduce_scatter(out, [inp(dtype, op, r, j, block(count, j)) for j in range(w)], op=o)
        return out
    if kind == "reduce_scatter_tensor":
        out = torch.zeros(count, dtype=dt)
        dist.reduce_scatter_tensor(out, inp(dtype, op, r, 0, count * w), op=o)
        return out
    if kind == "all_to_all":
        # Even blocks: Gloo refuses blocks of different sizes (collectix takes them).
        outs = [torch.zeros(count, dtype=dt) for _ in range(w)]
        dist.all_to_all(outs, [inp(dtype, op, r, j, count) for j in range(w)])
        return outs
    if kind == "all_to_all_single":
        ins = [a2a(count, r, j) for j in range(w)]
        outs = [a2a(count, j, r) for j in range(w)]
        out = torch.zeros(sum(outs), dtype=dt)
        dist.all_to_all_single(out, inp(dtype, op, r, 0, sum(ins)), outs, ins)
        return out
    raise ValueError(kind)


def encode(out):
    if out is None:
        return "-"
    if isinstance(out, str):
        return out
    if isinstance(out, list):
        return "[" + ",".join(show(t) for t in out) + "]"
    return show(out)


def rank_main(r, w, init, folder):
    dist.init_process_group(
        "gloo", init_method=init, rank=r, world_size=w, timeout=datetime.timedelta(seconds=60)
    )
    lines = []
    for case in cases():
        kind, cw, count, dtype, op, root = case
        if cw != w:
            continue
        # Every rank checks the case alike before it runs (Gloo's refusals are local), and
        # the ranks agree on whether all of them can run it, so that no rank waits for a
        # collective the others refused.
        try:
            out = encode(run(kind, w, r, count, dtype, op, root))
            err = ""
        except Exception as e:  # torch's refusal of this case on Gloo
            out, err = "", str(e).splitlines()[0][:120]
        ok = torch.tensor([0 if err else 1], dtype=torch.int32)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        lines.append((case, out, err, int(ok.item())))
    with open(os.path.join(folder, f"r{r}.txt"), "w") as f:
        for (kind, cw, count, dtype, op, root), out, err, ok in lines:
            f.write(f"{kind}\t{count}\t{dtype}\t{op}\t{root}\t{out}\t{err}\t{ok}\n")
    dist.destroy_process_group()


def main():
    print(f"# collectix's differential set, recorded from torch {torch.__version__} (Gloo)")
    print("# by tests/torch_reference/record.py: see its doc for the format and the inputs.")
    for w in WS:
        with tempfile.TemporaryDirectory() as folder:
            init = "file://" + os.path.join(folder, "store")
            mp.spawn(rank_main, args=(w, init, folder), nprocs=w, join=True)
            per_rank = []
            for r in range(w):
                with open(os.path.join(folder, f"r{r}.txt")) as f:
                    per_rank.append([ln.rstrip("\n").split("\t") for ln in f])
        for rows in zip(*per_rank):
            kind, count, dtype, op, root = rows[0][:5]
            head = f"{kind} w={w} count={count} dtype={dtype} op={op} root={root} :"
            if rows[0][7] != "1":
                err = next((row[6] for row in rows if row[6]), "refused on another rank")
                print(f"{head} unsupported {err}")
            else:
                print(head + "".join(f" r{r}={row[5]}" for r, row in enumerate(rows)))


if __name__ == "__main__":
    sys.exit(main())
