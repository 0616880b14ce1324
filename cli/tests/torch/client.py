"""torch's clients of a collectix store (TcpStoreServer::open_to_torch, `collectix store
--torch`): rank 0 uses every store call on a key the Rust side set; both ranks then
rendezvous a Gloo process group through the same store and all_reduce.

Usage: python client.py PORT RANK
"""
import datetime
import sys

import torch
import torch.distributed as dist

port, rank = int(sys.argv[1]), int(sys.argv[2])
timeout = datetime.timedelta(seconds=30)
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
if rank == 0:
    got = store.get("from_rust").decode()
    store.set("from_python", "hello from torch")
    added = store.add("count", 5)
    swapped = store.compare_set("cas", "", "first").decode()
    kept = store.compare_set("cas", "other", "second").decode()
    ready = store.check(["from_rust"])
    not_ready = store.check(["from_rust", "nobody"])
    deleted = store.delete_key("cas")
    store.wait(["from_python"])
    print(
        f"get {got}; add {added}; compare_set {swapped} then {kept}; "
        f"check {ready} {not_ready}; delete {deleted}",
        flush=True,
    )
dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"rank {rank}: all_reduce {t.item()}", flush=True)
dist.destroy_process_group()
