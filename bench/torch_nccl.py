"""torch.distributed all_reduce over NCCL, printed like collectix's gpu_bench example:
sizes from 1 MiB to MAX_MIB (f32, world of one on cuda:0; in place, out of place issued in a
loop twice, out of place blocking), then the per-call overhead of a 4-byte all_reduce (issue,
then wait).  Usage: python3 bench/torch_nccl.py [MAX_MIB]"""
import os, sys, time
import torch
import torch.distributed as dist

max_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
print(f"# torch {torch.__version__} NCCL {torch.cuda.nccl.version()} world of 1 on cuda:0, f32 sum")
print("# in place: dist.all_reduce(x); out of place: y = x.clone(); dist.all_reduce(y) "
      "(collectix's value semantics).\n# 'issued' columns: ITERS calls issued, then waited; "
      "'first' is the first such loop at a size, 'again' the same loop once more; 'blocking': "
      "each call issued, then torch.cuda.synchronize(). Times per call.")
print(f"#{'size(B)':>12} {'iters':>6} {'inplace':>10} {'oop-first':>10} {'oop-again':>10} "
      f"{'oop-block':>10} {'algbw(GB/s)':>11} {'#wrong':>7}")


def issued(x, iters, in_place):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = []
    for _ in range(iters):
        y = x if in_place else x.clone()
        outs.append((y, dist.all_reduce(y, async_op=True)))
    for y, w in outs:
        w.wait()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / iters, outs[-1][0]


mib = 1
while mib <= max_mib:
    count = mib << 18
    x = torch.ones(count, dtype=torch.float32, device="cuda")
    iters = min(max(200 // mib, 5), 50)
    for _ in range(3):
        dist.all_reduce(x.clone())
    inplace, _ = issued(x, iters, True)
    x.fill_(1.0)
    first, _ = issued(x, iters, False)
    again, last = issued(x, iters, False)
    wrong = int((last != 1.0).sum().item())
    del last
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        y = x.clone()
        dist.all_reduce(y)
        torch.cuda.synchronize()
    block = (time.perf_counter() - t0) * 1e6 / iters
    print(f" {count*4:>12} {iters:>6} {inplace:>10.1f} {first:>10.1f} {again:>10.1f} "
          f"{block:>10.1f} {count*4/again/1e3:>11.2f} {wrong:>7}")
    mib *= 2
small = torch.ones(1, dtype=torch.float32, device="cuda")
def per_call(label, f):
    for _ in range(100):
        f()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    print(f"# per call, issue then wait, {label}: {(time.perf_counter()-t0)*1e6/n:.1f} us")
per_call("4 B all_reduce on cuda:0 (wait = stream wait only)", lambda: dist.all_reduce(small, async_op=True).wait())
per_call("4 B all_reduce on cuda:0, then torch.cuda.synchronize()", lambda: (dist.all_reduce(small), torch.cuda.synchronize()))
per_call("4 B all_reduce on cuda:0, out of place (clone, all_reduce, synchronize)", lambda: (dist.all_reduce(small.clone()), torch.cuda.synchronize()))
dist.destroy_process_group()
