"""One rank of the init-time comparison (scripts/peers/scale_init.sh): times torch.distributed's
init_process_group with gloo (torch imported before the clock starts) and a barrier, and
prints: scale rank=R world=N init_start_ns=.. init_end_ns=.. ok=1. Rank, world and the
rendezvous come from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (env:// init)."""
import os
import time

import torch.distributed as dist

start = time.time_ns()
dist.init_process_group("gloo", init_method="env://")
dist.barrier()
end = time.time_ns()
print(
    f"scale rank={dist.get_rank()} world={dist.get_world_size()} init_start_ns={start} init_end_ns={end} ok=1",
    flush=True,
)
dist.destroy_process_group()
