"""torch.distributed all_reduce over NCCL, printed like collectix's gpu_bench example:
sizes from 1 MiB to MAX_MIB (f32, world of one on cuda:0), then the per-call overhead of a
4-byte all_reduce (issue, then wait).  Usage: python3 bench/torch_nccl.py [MAX_MIB]"""
import os, sys, time
import torch
import torch.distributed as dist

max_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
print(f"# torch {torch.__version__} NCCL {torch.cuda.nccl.version()} world of 1 on cuda:0, f32 sum")
for in_place in (True, False):
    print("# " + ("in place: dist.all_reduce(x)" if in_place else
                  "out of place: y = x.clone(); dist.all_reduce(y) (collectix's value semantics)"))
    print(f"#{'size(B)':>12} {'count':>12} {'time(us)':>10} {'algbw(GB/s)':>11} {'#wrong':>7}")
    mib = 1
    while mib <= max_mib:
        count = mib << 18
        x = torch.ones(count, dtype=torch.float32, device="cuda")
        iters = min(max(200 // mib, 5), 50)
        for _ in range(3):
            dist.all_reduce(x.clone())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = []
        for _ in range(iters):
            y = x if in_place else x.clone()
            outs.append((y, dist.all_reduce(y, async_op=True)))
        for y, w in outs:
            w.wait()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) * 1e6 / iters
        wrong = int((outs[-1][0] != 1.0).sum().item())
        print(f" {count*4:>12} {count:>12} {us:>10.1f} {count*4/us/1e3:>11.2f} {wrong:>7}")
        del outs
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
dist.destroy_process_group()
