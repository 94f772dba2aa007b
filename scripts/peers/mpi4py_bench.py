#!/usr/bin/env python3
"""Open MPI through mpi4py (numpy float32 buffers): one collective, f32 sum, timed like
`oxccl bench`. Run under mpirun:

  mpirun -np N python mpi4py_bench.py --op all_reduce --bytes 65536 --iters 1000 --warmup 100

Same protocol and output as ompi_bench.c (the C harness): the nccl-tests size convention
(per-rank buffer; all_gather's output, reduce_scatter's input; count rounded down to a
multiple of the world size for blocked ops), out of place and in place (MPI.IN_PLACE;
Bcast has one form), one checked call, WARMUP untimed calls, a barrier, ITERS timed calls;
the loop mean per call, maximum over ranks. Rank 0 prints one JSON line per placement.
Adapted from an earlier peer harness.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from common import compact, element_counts

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", required=True, choices=OPS)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--iters", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=0)
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    op = a.op
    count, block = element_counts(op, a.bytes, n)
    f32 = np.float32
    sbuf = np.zeros(max(count, 1), dtype=f32)[:count]
    rbuf = np.zeros(max(count, 1), dtype=f32)[:count]
    IN_PLACE, SUM = MPI.IN_PLACE, MPI.SUM

    def run(in_place):
        if op == "all_reduce":
            comm.Allreduce(IN_PLACE if in_place else sbuf, rbuf, op=SUM)
        elif op == "all_gather":
            comm.Allgather(IN_PLACE if in_place else sbuf[:block], rbuf)
        elif op == "reduce_scatter":
            if in_place:
                comm.Reduce_scatter_block(IN_PLACE, rbuf, op=SUM)
            else:
                comm.Reduce_scatter_block(sbuf, rbuf[:block], op=SUM)
        elif op == "broadcast":
            comm.Bcast(rbuf, root=0)
        else:
            comm.Alltoall(IN_PLACE if in_place else sbuf, rbuf)

    tri = n * (n + 1) / 2
    blocks = np.arange(n, dtype=f32).repeat(block)  # block index j of every element

    def fill(in_place):
        inp = rbuf if in_place else sbuf
        rbuf.fill(-1)
        if op == "all_reduce":
            inp.fill(rank + 1)
        elif op == "all_gather":
            (rbuf[rank * block:(rank + 1) * block] if in_place else sbuf[:block]).fill(rank + 1)
        elif op == "reduce_scatter":
            inp[:] = (rank + 1) * (blocks + 1)
        elif op == "broadcast":
            rbuf.fill(7 if rank == 0 else -1)
        else:
            inp[:] = rank * n + blocks

    def check():
        if op == "all_reduce":
            return bool(np.all(rbuf == tri))
        if op == "all_gather":
            return bool(np.all(rbuf == blocks + 1))
        if op == "reduce_scatter":
            return bool(np.all(rbuf[:block] == tri * (rank + 1)))
        if op == "broadcast":
            return bool(np.all(rbuf == 7))
        return bool(np.all(rbuf == blocks * n + rank))

    affinity = sorted(os.sched_getaffinity(0))
    affs = comm.gather(compact(affinity), root=0)
    version = MPI.Get_library_version().strip("\x00 \n").splitlines()[0].strip()
    failed = False
    for in_place in ([True] if op == "broadcast" else [False, True]):
        fill(in_place)
        run(in_place)
        ok = comm.allreduce(check(), op=MPI.LAND)
        failed |= not ok
        for _ in range(a.warmup):
            run(in_place)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            run(in_place)
        t = (time.perf_counter() - t0) / max(a.iters, 1) * 1e6
        tmax = comm.reduce(t, op=MPI.MAX, root=0)
        if rank == 0:
            print(json.dumps({
                "op": op, "bytes": count * 4, "count": count, "world": n, "in_place": in_place,
                "time_us": round(tmax, 3), "iters": a.iters, "warmup": a.warmup, "ok": ok,
                "version": version, "mpi4py": __import__("mpi4py").__version__,
                "numpy": np.__version__, "affinity": affs,
            }), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
