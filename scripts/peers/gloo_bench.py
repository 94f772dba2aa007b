#!/usr/bin/env python3
"""torch.distributed with the gloo backend (CPU, float32): one collective, timed like
`oxccl bench`.

  python gloo_bench.py --world N --op all_reduce --bytes 65536 --iters 1000 --warmup 100

Launches N ranks as child processes of itself on 127.0.0.1 (no affinity set) and relays rank
0's JSON lines. Same protocol and output as ompi_bench.c: the nccl-tests size convention,
one checked call, WARMUP untimed calls, a barrier, ITERS timed calls; the loop mean per call,
maximum over ranks. torch's calls decide the placement: all_reduce and broadcast are in
place; all_gather (all_gather_into_tensor), reduce_scatter (reduce_scatter_tensor) and
all_to_all (all_to_all_single) out of place. Adapted from an earlier peer harness.

  python gloo_bench.py --env --op all_reduce --bytes 65536 --iters 1000 --warmup 100

With --env this process is one rank of a job that the caller started, described torchrun
style by the environment: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (rank 0 hosts the
store there; GLOO_SOCKET_IFNAME picks the interface). Rank 0 prints the same JSON line; no
child is started and --timeout bounds the rendezvous and every collective. Used across
network namespaces by scripts/peers/compare_tcp.sh.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

from common import compact, element_counts

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def child(a):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.env:  # one rank of a job described by the environment
        import datetime

        addr = os.environ["MASTER_ADDR"]
        host = f"[{addr}]" if ":" in addr else addr
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{os.environ['MASTER_PORT']}",
                                rank=rank, world_size=n, timeout=datetime.timedelta(seconds=a.timeout))
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['BENCH_PORT']}",
                                rank=rank, world_size=n)
    op = a.op
    count, block = element_counts(op, a.bytes, n)
    f32 = torch.float32
    sbuf = torch.zeros(count, dtype=f32)
    rbuf = torch.zeros(count, dtype=f32)
    blocks = torch.arange(n, dtype=f32).repeat_interleave(block)
    tri = n * (n + 1) / 2
    in_place = op in ("all_reduce", "broadcast")
    api = {"all_reduce": "all_reduce", "broadcast": "broadcast", "all_gather": "all_gather_into_tensor",
           "reduce_scatter": "reduce_scatter_tensor", "all_to_all": "all_to_all_single"}[op]
    if op == "all_gather":
        inp, out = sbuf[:block], rbuf
    elif op == "reduce_scatter":
        inp, out = sbuf, rbuf[:block]
    else:
        inp, out = sbuf, rbuf

    def run():
        if op == "all_reduce":
            dist.all_reduce(rbuf, op=dist.ReduceOp.SUM)
        elif op == "broadcast":
            dist.broadcast(rbuf, src=0)
        elif op == "all_gather":
            dist.all_gather_into_tensor(out, inp)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)
        else:
            dist.all_to_all_single(out, inp)

    rbuf.fill_(-1)
    if op == "all_reduce":
        rbuf.fill_(rank + 1)
    elif op == "broadcast":
        rbuf.fill_(7 if rank == 0 else -1)
    elif op == "all_gather":
        inp.fill_(rank + 1)
    elif op == "reduce_scatter":
        inp.copy_((rank + 1) * (blocks + 1))
    else:
        inp.copy_(rank * n + blocks)
    error = None
    try:
        run()
    except (RuntimeError, NotImplementedError) as e:  # an op this torch's gloo lacks
        error = f"{api}: {str(e).splitlines()[0][:200]}"
    if error is None:
        if op == "all_reduce":
            ok = bool(torch.all(rbuf == tri))
        elif op == "broadcast":
            ok = bool(torch.all(rbuf == 7))
        elif op == "all_gather":
            ok = bool(torch.all(rbuf == blocks + 1))
        elif op == "reduce_scatter":
            ok = bool(torch.all(out == tri * (rank + 1)))
        else:
            ok = bool(torch.all(rbuf == blocks * n + rank))
    else:
        ok = False
    flags = torch.tensor([0 if ok else 1, 0 if error is None else 1], dtype=torch.int32)
    dist.all_reduce(flags)
    if flags[1].item() != 0:
        if rank == 0:
            print(json.dumps({"op": op, "world": n, "error": error or "failed on another rank",
                              "version": torch.__version__}), flush=True)
        dist.destroy_process_group()
        return 3
    for _ in range(a.warmup):
        run()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        run()
    t = (time.perf_counter() - t0) / max(a.iters, 1) * 1e6
    affs = [None] * n
    dist.all_gather_object(affs, compact(sorted(os.sched_getaffinity(0))))
    tt = torch.tensor([t], dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({
            "op": op, "bytes": count * 4, "count": count, "world": n, "in_place": in_place,
            "time_us": round(tt.item(), 3), "iters": a.iters, "warmup": a.warmup,
            "ok": flags[0].item() == 0, "version": torch.__version__, "api": api,
            "affinity": affs,
        }), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if flags[0].item() == 0 else 1


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def launcher(a):
    def _term(signum, frame):  # so that `timeout` or Ctrl-C still reaps the children
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    port = free_port()
    procs = []
    for r in range(a.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world), BENCH_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--child"] + sys.argv[1:]
        procs.append(subprocess.Popen(cmd, env=env, stdout=None if r == 0 else subprocess.DEVNULL))
    rc = 0
    deadline = time.time() + a.timeout
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.time()))
            rc = rc or p.returncode
            if p.returncode != 0:
                break
    except subprocess.TimeoutExpired:
        rc = 124
    finally:
        for p in procs:  # only our own children, by PID
            if p.poll() is None:
                p.kill()
                p.wait()
    return rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--op", required=True, choices=OPS)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--iters", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--env", action="store_true",
                    help="one rank of a job described by RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT")
    a = ap.parse_args()
    return child(a) if a.child or a.env else launcher(a)


if __name__ == "__main__":
    sys.exit(main())
