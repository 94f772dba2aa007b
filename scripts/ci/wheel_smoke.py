"""Smoke test of an installed oxccl wheel: 2 processes, started as torchrun starts ranks
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, a shared OXCCL_SECRET), run all_reduce and
check the result. ``core``: oxccl's own API on array.array buffers (nothing but the wheel
needed). ``torch``: the ``oxccl`` torch.distributed backend on CPU tensors.

Each rank checks that ``oxccl`` was imported from this interpreter's environment (the
installed wheel), not from a checkout. scripts/ci/wheel_check.sh runs it with a copy of this
file outside the checkout, under a PATH without Rust or a C compiler.

Usage: python wheel_smoke.py core|torch      (exits non-zero, with each rank's output, on failure)
"""

import os
import random
import socket
import subprocess
import sys

WORLD = 2


def _free_port():
    # The port and the next one, as python/tests/launch.py picks them.
    while True:
        p = random.randint(20000, 40000)
        try:
            for q in (p, p + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue


def _installed_oxccl():
    import oxccl
    import oxccl._oxccl as ext

    for f in (oxccl.__file__, ext.__file__):
        if not os.path.realpath(f).startswith(os.path.realpath(sys.prefix) + os.sep):
            raise AssertionError(f"oxccl was imported from {f}, not from this environment ({sys.prefix})")
    return oxccl, ext


def core_rank(rank):
    import array

    oxccl, ext = _installed_oxccl()
    comm = oxccl.init()
    assert (comm.rank, comm.world_size) == (rank, WORLD), (comm.rank, comm.world_size)
    x = array.array("f", [float(rank + 1)] * 1024)
    comm.all_reduce(x)
    want = float(sum(range(1, WORLD + 1)))
    assert all(v == want for v in x), f"all_reduce sum: got {x[:4].tolist()}, want {want}"
    y = array.array("q", [rank * 10 + i for i in range(5)])
    comm.all_reduce(y, oxccl.ReduceOp.MAX)
    assert y.tolist() == [(WORLD - 1) * 10 + i for i in range(5)], f"all_reduce max: got {y.tolist()}"
    print(f"rank {rank}: core all_reduce ok on {comm.backend}, oxccl {oxccl.__version__} from {ext.__file__}")


def torch_rank(rank):
    import torch
    import torch.distributed as dist

    oxccl, ext = _installed_oxccl()
    import oxccl.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("oxccl")
    assert dist.get_backend() == "oxccl" and dist.get_world_size() == WORLD
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        t = torch.full((1000,), rank + 1, dtype=dtype)
        dist.all_reduce(t)
        want = torch.full((1000,), sum(range(1, WORLD + 1)), dtype=dtype)
        assert torch.equal(t, want), f"all_reduce {dtype}: got {t[:4].tolist()}"
    t = torch.arange(8.0) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    assert torch.equal(t, torch.arange(8.0) * WORLD), f"async all_reduce max: got {t.tolist()}"
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: torch {torch.__version__} all_reduce ok on the oxccl backend, oxccl from {ext.__file__}")


def launch(mode):
    port = _free_port()
    procs = []
    for r in range(WORLD):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OXCCL_") or k == "OXCCL_FR_DIR"}
        env.update(RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(WORLD),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OXCCL_SECRET="wheel-check",
                   OXCCL_TIMEOUT="30s", WHEEL_SMOKE_CHILD="1")
        # -I: no PYTHONPATH, no user site, not this file's folder: only the environment's packages.
        procs.append(subprocess.Popen([sys.executable, "-I", "-u", os.path.abspath(__file__), mode], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    failed = False
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += "\n(killed after 180 s: the ranks hung)"
        ok = p.returncode == 0 and f"rank {r}: " in out
        failed |= not ok
        print(f"--- rank {r} ({'ok' if ok else f'FAILED, exit {p.returncode}'}):\n{out.rstrip()}")
    if failed:
        sys.exit(f"wheel_smoke {mode}: a rank failed (its output is above)")
    print(f"wheel_smoke {mode}: {WORLD} ranks ok")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("core", "torch"):
        sys.exit("usage: python wheel_smoke.py core|torch")
    if os.environ.get("WHEEL_SMOKE_CHILD") == "1":
        {"core": core_rank, "torch": torch_rank}[sys.argv[1]](int(os.environ["RANK"]))
    else:
        launch(sys.argv[1])
