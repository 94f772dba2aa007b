"""The table of scripts/gpu/gpu_staged_check.sh: all_reduce float sum, in place, loop-mean time of
one call (us), with issue 11's figures: device/host at 64 MiB (<= 1.3), gloo/device at 64 MiB
(>= 2), device at 8 B (< 50 us).

Columns: the cpu backend with buffers on cuda:0 (staged through pinned host memory) and on
the host, 2 ranks; 1 rank on cuda:0; 2 ranks as threads of one process (`local`, one CUDA
context) on cuda:0; PyTorch gloo on CUDA tensors; the mpi backend staged and on the host.

Usage: python3 scripts/gpu/staged_summary.py OUT
"""
import json
import sys

out = sys.argv[1]
nan = float("nan")


def oxccl(name):
    rows = {}
    for part in ("small", "large"):
        try:
            rep = json.load(open(f"{out}/{name}-{part}.json"))
        except (OSError, ValueError):
            continue
        rows.update({r["size"]: r["time_us"] for r in rep["rows"] if r["in_place"]})
    return rows


def gloo(n):
    rows = {}
    try:
        for line in open(f"{out}/gloo-{n}.txt", errors="replace"):
            f = line.split()
            if len(f) >= 3 and f[0].isdigit():
                rows[int(f[0])] = float(f[2])
    except OSError:
        pass
    return rows


def cell(v):
    return f"{v:>10.1f}" if v == v else f"{'-':>10}"


cols = {
    "cpu cuda:0": oxccl("cpu-cuda-2"),
    "cpu host": oxccl("cpu-host-2"),
    "1 rank cuda": oxccl("cpu-cuda-1"),
    "local cuda": oxccl("local-cuda-2"),
    "gloo cuda": gloo(2),
    "mpi staged": oxccl("mpi-staged-2"),
    "mpi host": oxccl("mpi-host-2"),
}
dev, host, g = cols["cpu cuda:0"], cols["cpu host"], cols["gloo cuda"]
print("2 ranks (1 where named): all_reduce float sum in place, time per call (us)")
print(f"{'size(B)':>10} " + " ".join(f"{k:>10}" for k in cols) + f" {'dev/host':>9} {'gloo/dev':>9}")
for size in sorted(set().union(*cols.values())):
    d, h, t = dev.get(size, nan), host.get(size, nan), g.get(size, nan)
    print(f"{size:>10} " + " ".join(cell(c.get(size, nan)) for c in cols.values()) + f" {d / h:>9.2f} {t / d:>9.2f}")
big = 64 << 20
print()
if big in dev:
    print(f"issue 11, 2 ranks, 64 MiB: device/host {dev[big] / host.get(big, nan):.2f} (target <= 1.3), "
          f"gloo/device {g.get(big, nan) / dev[big]:.2f} (target >= 2)")
if 8 in dev:
    print(f"issue 11, 2 ranks, 8 B on the device: {dev[8]:.1f} us (target < 50; gloo {g.get(8, nan):.1f}); "
          f"1 rank {cols['1 rank cuda'].get(8, nan):.1f}, 2 threads of one process {cols['local cuda'].get(8, nan):.1f}")
d4, h4, g4 = oxccl("cpu-cuda-4"), oxccl("cpu-cpu-4"), gloo(4)
if big in d4:
    print(f"issue 11, 4 ranks, 64 MiB: device {d4[big]:.0f} us, host {h4.get(big, nan):.0f}, gloo {g4.get(big, nan):.0f}: "
          f"device/host {d4[big] / h4.get(big, nan):.2f}, gloo/device {g4.get(big, nan) / d4[big]:.2f}")
