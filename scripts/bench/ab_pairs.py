#!/usr/bin/env python3
"""Two oxccl binaries, A and B, in paired runs: each pair runs `A bench` and `B bench` one
after the other (the order alternates between pairs), and the script prints every run and
the median of the pairs' differences B - A. On a shared, noisy machine the difference within
a pair is far steadier than either binary's times across minutes.

  python3 scripts/bench/ab_pairs.py A B PAIRS [--op OP] [--size BYTES] [--ranks N] [--iters N]
      [--env K=V ...]

--env settings apply to both binaries (e.g. OXCCL_ALGO=broadcast:binomial_tree,
OXCCL_TRANSPORT=tcp). Times are oxccl bench's (loop mean per call, max over ranks), out of
place and in place; send_recv has only the former.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("pairs", type=int)
    ap.add_argument("--op", default="all_reduce")
    ap.add_argument("--size", default="8")
    ap.add_argument("--ranks", default="2")
    ap.add_argument("--iters", default="200000")
    ap.add_argument("--env", action="append", default=[], help="K=V for both binaries")
    args = ap.parse_args()
    for binary in (args.a, args.b):
        if not os.access(binary, os.X_OK):
            sys.exit(f"{binary}: not an executable (an oxccl binary, e.g. target/release/oxccl copied aside)")
    env = dict(os.environ)
    for kv in args.env:
        if "=" not in kv:
            sys.exit(f"--env wants K=V, got {kv!r}")
        k, v = kv.split("=", 1)
        env[k] = v

    def run(binary):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [binary, "bench", args.op, "--ranks", args.ranks, "-b", args.size, "-e", args.size,
                   "-n", args.iters, "-w", "1000", "-c", "0", "--json", out.name]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
            rows = json.load(open(out.name))["rows"]
        t = {r["in_place"]: r["time_us"] for r in rows}
        oop = t.get(False, float("nan"))
        return oop, t.get(True, oop)

    ra, rb = [], []
    for i in range(args.pairs):
        if i % 2 == 0:
            x, y = run(args.a), run(args.b)
        else:
            y, x = run(args.b), run(args.a)
        ra.append(x)
        rb.append(y)
    print("A", " ".join(f"{x[0]:.2f}/{x[1]:.2f}" for x in ra))
    print("B", " ".join(f"{y[0]:.2f}/{y[1]:.2f}" for y in rb))
    d_oop = statistics.median((y[0] - x[0]) * 1000 for x, y in zip(ra, rb))
    d_ip = statistics.median((y[1] - x[1]) * 1000 for x, y in zip(ra, rb))
    a_oop = statistics.median(x[0] for x in ra) * 1000
    print(f"{args.op} {args.size} B on {args.ranks} ranks, {args.pairs} pairs: median B-A "
          f"{d_oop:.0f} ns out of place, {d_ip:.0f} ns in place; median A {a_oop:.0f} ns")


if __name__ == "__main__":
    main()
