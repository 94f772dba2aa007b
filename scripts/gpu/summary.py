"""The side-by-side table of scripts/gpu/gpu_check.sh: for each world size and message size, the
loop-mean time of one all_reduce (float sum, in place, waited for) through oxccl, through
NCCL called from C, and through PyTorch, with oxccl's overhead over C and the ratios.

Usage: python3 scripts/gpu/summary.py OUT   (reads OUT/c-N.txt, OUT/oxccl-N.json, OUT/torch-N.txt
for each world size N that has one of them; a missing PyTorch table leaves its columns nan)
"""
import json, os, re, sys
out = sys.argv[1]
NOTE = ("NOTE: ranks sharing one GPU talk through NCCL's socket transport (NCCL_HOSTID): the 2- and "
        "4-rank figures measure correctness and API overhead, not speed; only the 1-rank figures "
        "compare kernels.")
def table(path):
    rows = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) >= 4 and f[0].isdigit():
            rows[int(f[0])] = float(f[2])  # time_sync(us)
    return rows
worlds = set()
for name in os.listdir(out):
    m = re.fullmatch(r"(?:c|torch)-(\d+)\.txt|oxccl-(\d+)\.json", name)
    if m:
        worlds.add(int(m.group(1) or m.group(2)))
print(NOTE)
print(f"{'ranks':>5} {'size(B)':>10} {'C (us)':>10} {'oxccl (us)':>11} {'torch (us)':>11} {'oxccl-C (us)':>13} {'oxccl/C':>8} {'oxccl/torch':>12}")
for n in sorted(worlds) or [1, 2]:
    try:
        c = table(f"{out}/c-{n}.txt")
        rep = json.load(open(f"{out}/oxccl-{n}.json"))
    except (OSError, ValueError) as e:
        print(f"{n:>5} missing: {e}")
        continue
    t = table(f"{out}/torch-{n}.txt") if os.path.exists(f"{out}/torch-{n}.txt") else {}
    ox = {r["size"]: r["time_us"] for r in rep["rows"] if r["in_place"]}
    for size in sorted(c):
        if size in ox:
            tt = t.get(size, float("nan"))
            print(f"{n:>5} {size:>10} {c[size]:>10.2f} {ox[size]:>11.2f} {tt:>11.2f} {ox[size]-c[size]:>13.2f} {ox[size]/c[size]:>8.3f} {ox[size]/tt:>12.3f}")
