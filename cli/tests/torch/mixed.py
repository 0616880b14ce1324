"""The Python side of a mixed job: torch serves the store (TCPStore, is_master=True), publishes
a value the Rust ranks wait for, and waits for the counter they add to.

Usage: python mixed.py WORLD   (prints "port N" first, then what it saw)
"""
import datetime
import sys
import time

import torch.distributed as dist

world = int(sys.argv[1])
minute = datetime.timedelta(seconds=60)
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=minute)
print(f"port {store.port}", flush=True)
store.set("from_python", "hello from torch")
store.wait(["rust_ranks"])
while int(store.get("rust_ranks")) < world:
    time.sleep(0.01)
print(f"rust ranks counted: {int(store.get('rust_ranks'))}", flush=True)
print(f"rank 0's address published: {store.check(['addr/0'])}", flush=True)
store.wait(["rust_done"])
print(f"rust done: {store.get('rust_done').decode()}", flush=True)
