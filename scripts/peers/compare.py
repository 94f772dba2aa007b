#!/usr/bin/env python3
"""The driver of scripts/peers/compare_peers.sh: runs oxccl's `bench` and its peers on the same
points, interleaved size by size in one run, and prints one table per (op, ranks).

Standard library only. compare_peers.sh installs and builds what the peers need and passes
their paths here (--oxccl, --ompi-bench, --mpirun, --python, --c2c); run that script, not
this file, unless those are already in place.

Every point (op, ranks, size) is one launch per peer. Every peer runs the same number of
iterations for a size (--iters, or the rule in iters_for) after the same warmup, and reports
the loop mean per op, maximum over ranks: what `oxccl bench` reports.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from common import element_counts

HERE = os.path.dirname(os.path.abspath(__file__))
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
PEERS = ("oxccl", "ompi-c", "ompi-py", "gloo")
BUSY = "+busy"
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
       "broadcast": lambda n: 1.0}


def parse_size(s):
    t = s.strip().upper().removesuffix("IB").removesuffix("B")
    for suf, shift in (("K", 10), ("M", 20), ("G", 30)):
        if t.endswith(suf):
            return int(t[:-1]) << shift
    return int(t)


def human(nbytes):
    for suf, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {suf}"
    return f"{nbytes} B"


def iters_for(size, fixed):
    """Timed iterations for a size, the same for every peer: --iters, or 2^28 bytes' worth
    clamped to [20, 5000] (5000 at 8 B to 64 KiB, 256 at 1 MiB, 20 at 16 MiB); warmup a tenth,
    at least 5."""
    iters = fixed or max(20, min(5000, (1 << 28) // max(size, 1)))
    return iters, max(5, iters // 10)


def measured_bytes(op, size, n):
    return element_counts(op, size, n)[0] * 4


def sh(cmd, timeout=30):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (p.stdout or p.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"? ({e.__class__.__name__})"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


class Runner:
    def __init__(self, a):
        self.a = a
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        if os.geteuid() == 0:
            self.env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.mpirun = []
        if a.mpirun:
            self.mpirun = [a.mpirun]
            if os.geteuid() == 0:
                self.mpirun.append("--allow-run-as-root")
            self.mpirun += ["--oversubscribe"]
        self.affinity = {}

    def bind(self, n):
        """mpirun's --bind-to for n ranks: with `auto`, core where every rank gets a CPU of
        its own (what `oxccl bench --ranks N` does by default, and mpirun's own default for
        small jobs), none where they outnumber the CPUs."""
        if self.a.mpi_bind != "auto":
            return self.a.mpi_bind
        return "core" if n <= len(os.sched_getaffinity(0)) else "none"

    def mpi(self, n):
        return self.mpirun + ["--bind-to", self.bind(n), "-np", str(n)]

    def c2c(self):
        if not self.a.c2c:
            return None
        try:
            out = subprocess.run([self.a.c2c, "20000"], capture_output=True, text=True, timeout=30).stdout
            return json.loads(out)["oneway_ns_median"]
        except (OSError, ValueError, KeyError, subprocess.SubprocessError):
            return None

    def launch(self, cmd, json_lines=True):
        """Runs cmd; returns (records, error)."""
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=self.a.timeout)
        except subprocess.TimeoutExpired:
            return [], f"timed out after {self.a.timeout:.0f} s"
        recs = []
        if json_lines:
            for line in p.stdout.splitlines():
                if line.startswith("{"):
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        pass
        err = None
        if p.returncode != 0 or (json_lines and not recs):
            lines = (p.stderr.strip() or p.stdout.strip()).splitlines()
            tail = [x for x in lines if x.strip().strip("-")][-3:]  # not mpirun's ---- rules
            err = f"exit {p.returncode}: " + " | ".join(x.strip() for x in tail)[:300]
        return recs, err

    def run(self, peer, op, n, size, iters, warm):
        """One point on one peer: a list of {place, time_us, bytes, ok, ...}, and an error.
        A peer named P+busy is P with --busy busy-looping processes running beside it."""
        if peer.endswith(BUSY):
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.a.busy)]
            time.sleep(0.2)  # let the scheduler see them running
            try:
                return self.run(peer[: -len(BUSY)], op, n, size, iters, warm)
            finally:
                for h in hogs:
                    h.kill()
                for h in hogs:
                    h.wait()
        if peer == "oxccl":
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                path = f.name
            cmd = [self.a.oxccl, "bench", op, "--ranks", str(n), "-b", str(size), "-e", str(size),
                   "-n", str(iters), "-w", str(warm), "--json", path] + shlex.split(self.a.extra)
            _, err = self.launch(cmd, json_lines=False)
            out = []
            try:
                with open(path) as f:
                    rep = json.load(f)
                for r in rep["rows"]:
                    out.append({"place": "ip" if r["in_place"] else "oop", "time_us": r["time_us"],
                                "bytes": r["size"], "ok": r["wrong"] in (0, None), "wrong": r["wrong"],
                                "backend": rep.get("backend")})
            except (OSError, ValueError, KeyError) as e:
                err = err or f"no JSON from oxccl bench ({e.__class__.__name__})"
            finally:
                if os.path.exists(path):
                    os.unlink(path)
            return out, err
        if peer == "ompi-c":
            cmd = self.mpi(n) + [self.a.ompi_bench, op, str(size), str(iters), str(warm)]
        elif peer == "ompi-py":
            cmd = self.mpi(n) + [self.a.python, os.path.join(HERE, "mpi4py_bench.py"),
                                 "--op", op, "--bytes", str(size), "--iters", str(iters), "--warmup", str(warm)]
        else:
            cmd = [self.a.python, os.path.join(HERE, "gloo_bench.py"), "--world", str(n), "--op", op,
                   "--bytes", str(size), "--iters", str(iters), "--warmup", str(warm),
                   "--timeout", str(self.a.timeout)]
        recs, err = self.launch(cmd)
        out = []
        for r in recs:
            if "error" in r:
                err = r["error"]
                continue
            if "affinity" in r:
                self.affinity.setdefault((peer, n), r["affinity"])
            out.append({"place": "ip" if r["in_place"] else "oop", "time_us": r["time_us"],
                        "bytes": r["bytes"], "ok": r["ok"], "version": r.get("version"),
                        "api": r.get("api")})
        if out and err and all(o["ok"] for o in out):
            err = None  # a non-zero exit after good records: only a failed check does that
        return out, err


def facts(a, runner):
    f = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
         "host": platform.node(), "nproc": os.cpu_count(),
         "affinity": ",".join(str(c) for c in sorted(os.sched_getaffinity(0))),
         "cpu": cpu_model(), "kernel": platform.release(),
         "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    try:
        with open("/proc/meminfo") as m:
            f["mem"] = m.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    if a.oxccl:
        f["oxccl"] = sh([a.oxccl, "--version"])
        rev = sh(["git", "-C", HERE, "rev-parse", "--short", "HEAD"])
        dirty = sh(["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"])
        f["oxccl"] += f" (git {rev}{', uncommitted changes' if dirty else ''}; binary {a.oxccl}, built "
        f["oxccl"] += datetime.datetime.fromtimestamp(os.path.getmtime(a.oxccl)).strftime("%Y-%m-%d %H:%M") + ")"
    if a.mpirun:
        f["open_mpi"] = sh([a.mpirun, "--version"]).splitlines()[0]
        if a.ompi_bench:
            f["mpicc"] = a.mpicc_version or "?"
    if a.python:
        code = ("import json,sys\nv={'python':sys.version.split()[0]}\n"
                "try:\n import numpy; v['numpy']=numpy.__version__\nexcept Exception: pass\n"
                "try:\n import mpi4py; mpi4py.rc.initialize=False\n from mpi4py import MPI\n"
                " v['mpi4py']=mpi4py.__version__+' on '+MPI.Get_library_version().strip(chr(0)).splitlines()[0].strip()\n"
                "except Exception: pass\n"
                "try:\n import torch; v['torch']=torch.__version__\nexcept Exception: pass\n"
                "print(json.dumps(v))")
        try:
            f.update({("venv_" + k if k == "python" else k): v for k, v in json.loads(sh([a.python, "-c", code])).items()})
        except ValueError:
            pass
    f["c2c_oneway_ns"] = runner.c2c()
    return f


def stat(values, how):
    return min(values) if how == "best" else statistics.median(values)


def fmt_time(t):
    if t is None:
        return "-"
    return f"{t:.2f}" if t < 1000 else f"{t:.0f}"


def table(op, n, sizes, peers, cells, errors, a, c2cs, runner):
    """cells[(size, place, peer)] -> list of (time_us, ok)."""
    how = "best" if a.stat == "best" else "median"
    over = f"{how} of {a.reps} reps" if a.reps > 1 else "1 rep"
    lines = [f"== {op}, {n} ranks   (µs per op: loop mean, max over ranks; {over})"]
    w = max(11, max(len(p) for p in peers) + 2)
    head = f"{'size':>9} {'place':>5} " + "".join(f"{p:>{w}}" for p in peers)
    ratios = [(a_, b_) for a_, b_ in (("oxccl", "ompi-c"), ("oxccl" + BUSY, "ompi-c" + BUSY),
                                       ("oxccl" + BUSY, "oxccl"), ("ompi-c" + BUSY, "ompi-c"))
              if a_ in peers and b_ in peers]
    names = {("oxccl", "ompi-c"): "oxccl/ompi-c", ("oxccl" + BUSY, "ompi-c" + BUSY): "busy ox/ompi",
             ("oxccl" + BUSY, "oxccl"): "oxccl busy/q", ("ompi-c" + BUSY, "ompi-c"): "ompi busy/q"}
    head += "".join(f"{names[r]:>14}" for r in ratios)
    lines.append(head)
    notes = []
    for size in sizes:
        mb = measured_bytes(op, size, n)
        label = human(size) + ("*" if mb != size else "")
        if mb != size:
            notes.append(f"* {human(size)}: {mb} B measured by every peer (count rounded down to a multiple of {n} ranks)"
                         + ("; MPI returns at once on 0 elements, so the ratio says little" if mb == 0 else ""))
        for place in ("oop", "ip"):
            row, vals = [], {}
            for p in peers:
                got = cells.get((size, place, p), [])
                if not got:
                    row.append("err" if (size, p) in errors else "-")
                    continue
                t = stat([x[0] for x in got], a.stat)
                vals[p] = t
                row.append(fmt_time(t) + ("" if all(x[1] for x in got) else "!"))
            if all(c == "-" for c in row):
                continue
            line = f"{label:>9} {place:>5} " + "".join(f"{c:>{w}}" for c in row)
            for a_, b_ in ratios:
                r = (vals[a_] / vals[b_]) if vals.get(a_) and vals.get(b_) else None
                line += f"{(f'{r:.2f}' if r is not None else '-'):>14}"
            lines.append(line)
    for (size, p), e in sorted(errors.items()):
        notes.append(f"err {p} at {human(size)}: {e}")
    if any(c.endswith("!") for c in " ".join(lines).split()):
        notes.append("! = the peer's check of the result failed")
    seen = [f"{p}: {runner.affinity[(p, n)]}" for p in peers if (p, n) in runner.affinity]
    if seen:
        notes.append("affinity per rank as the peers saw it: " + "; ".join(seen))
    cs = [c for c in c2cs if c is not None]
    if cs:
        notes.append(f"c2c one-way latency cpu0<->cpu1 around these points: {min(cs):.0f}-{max(cs):.0f} ns")
    return "\n".join(lines + ["   " + x for x in dict.fromkeys(notes)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="8,1K,64K,1M,16M")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--stat", choices=("median", "best"), default="median")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--extra", default="")
    ap.add_argument("--json", default=None)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--mpi-bind", default="auto")
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--oxccl")
    ap.add_argument("--ompi-bench")
    ap.add_argument("--mpicc-version")
    ap.add_argument("--mpirun")
    ap.add_argument("--python")
    ap.add_argument("--c2c")
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args()

    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        sys.exit(f"compare_peers: unknown op {', '.join(bad)}; expected some of {', '.join(OPS)}")
    ranks = [int(x) for x in a.ranks.split(",") if x.strip()]
    sizes = [parse_size(x) for x in a.sizes.split(",") if x.strip()]
    peers = [p.strip() for p in a.peers.split(",") if p.strip()]
    if not peers:
        sys.exit("compare_peers: no peer left to run (see the notes above)")
    if a.reps < 1 or any(n < 1 for n in ranks):
        sys.exit("compare_peers: --reps and --ranks must be at least 1")
    if a.busy < 0:
        sys.exit("compare_peers: --busy must be at least 0")
    if a.busy:
        peers = [q for p in peers for q in (p, p + BUSY)]
    runner = Runner(a)
    jpath = a.json
    if not jpath:
        d = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "peers")
        os.makedirs(d, exist_ok=True)
        jpath = os.path.join(d, time.strftime("compare-%Y%m%d-%H%M%S.jsonl"))
    jf = open(jpath, "w")

    def jl(rec):
        jf.write(json.dumps(rec, sort_keys=True) + "\n")
        jf.flush()

    f = facts(a, runner)
    print("# oxccl and its peers, side by side from one run on this host")
    for k in ("date", "host", "nproc", "affinity", "cpu", "mem", "kernel", "loadavg", "c2c_oneway_ns",
              "oxccl", "open_mpi", "mpicc", "venv_python", "numpy", "mpi4py", "torch"):
        if f.get(k) is not None:
            print(f"#   {k + ':':<15}{f[k]}")
    print(f"# peers: {', '.join(peers)}")
    print(f"#   oxccl:   {a.oxccl} bench OP --ranks N -b S -e S -n ITERS -w WARMUP {a.extra}".rstrip()
          + f"   (backend {'cpu' if '--backend' not in a.extra else 'as --extra says'}; binds as below)")
    if "ompi-c" in peers:
        print(f"#   ompi-c:  {' '.join(runner.mpirun)} --bind-to B -np N {a.ompi_bench} OP S ITERS WARMUP   (the C API)")
    if "ompi-py" in peers:
        print(f"#   ompi-py: {' '.join(runner.mpirun)} --bind-to B -np N {a.python} scripts/peers/mpi4py_bench.py ...   (mpi4py, numpy buffers)")
    if "gloo" in peers:
        print(f"#   gloo:    {a.python} scripts/peers/gloo_bench.py --world N ...   "
              "(torch.distributed gloo over loopback TCP; sets no CPU affinity)")
    how = ("core where the ranks fit the CPUs, else none" if a.mpi_bind == "auto" else a.mpi_bind)
    bind = {"oxccl": "oxccl --bind-to auto (core where the ranks fit the CPUs, else none)",
            "ompi-c": f"ompi-c mpirun --bind-to {how}", "ompi-py": f"ompi-py mpirun --bind-to {how}",
            "gloo": "gloo none"}
    print("# binding: " + "; ".join(bind[p] for p in peers if p in bind))
    if a.busy:
        print(f"# P{BUSY}: P measured with {a.busy} busy-looping process(es) (python `while True: pass`) beside it;"
              " busy/q = P{BUSY} / P from the same run")
    for note in a.note:
        print(f"# note: {note}")
    print("# size: nccl-tests convention (the per-rank buffer; all_gather's output, reduce_scatter's input); f32, sum")
    print("# place: oop = out of place, ip = in place (MPI_IN_PLACE); MPI_Bcast and torch's all_reduce and")
    print("#   broadcast have only their in-place form, torch's all_gather, reduce_scatter and all_to_all only out of place")
    print("# iterations (every peer the same): " + ", ".join(
        f"{human(s)}: {iters_for(s, a.iters)[0]}+{iters_for(s, a.iters)[1]} warmup" for s in sizes))
    print(f"# time: loop mean per op, max over ranks (what oxccl bench reports); {a.reps} rep(s) of every point, "
          f"{'best (minimum)' if a.stat == 'best' else 'median'} shown; peers interleaved size by size"
          + (", their order rotated each rep" if a.reps > 1 else ""))
    print(f"# JSON lines: {jpath}")
    print(flush=True)
    jl({"kind": "facts", **f, "peers": peers, "ops": ops, "ranks": ranks, "sizes": sizes, "reps": a.reps,
        "stat": a.stat, "extra": a.extra, "mpirun": runner.mpirun, "notes": a.note})

    for op in ops:
        for n in ranks:
            cells, errors, c2cs = {}, {}, []
            for rep in range(a.reps):
                order = peers[rep % len(peers):] + peers[:rep % len(peers)]
                for size in sizes:
                    iters, warm = iters_for(size, a.iters)
                    c2cs.append(runner.c2c())
                    for p in order:
                        t0 = time.time()
                        out, err = runner.run(p, op, n, size, iters, warm)
                        took = time.time() - t0
                        shown = " ".join(f"{o['place']} {fmt_time(o['time_us'])}" for o in out)
                        print(f"  [{op} n={n} {human(size)} rep {rep + 1}/{a.reps}] {p}: {shown or '-'}"
                              f"{'  ERROR ' + err if err else ''}  ({took:.1f} s)", file=sys.stderr, flush=True)
                        if err:
                            errors[(size, p)] = err
                        for o in out:
                            cells.setdefault((size, o["place"], p), []).append((o["time_us"], o["ok"]))
                            jl({"kind": "point", "peer": p, "op": op, "ranks": n, "size": size, "rep": rep,
                                "iters": iters, "warmup": warm, "c2c_ns": c2cs[-1],
                                "busbw_gbps": (o["bytes"] / o["time_us"] / 1e3 * BUS[op](n)) if o["time_us"] else None,
                                **o})
                        if err:
                            jl({"kind": "error", "peer": p, "op": op, "ranks": n, "size": size, "rep": rep,
                                "error": err})
            for (size, place, p), got in sorted(cells.items()):
                jl({"kind": "summary", "peer": p, "op": op, "ranks": n, "size": size, "place": place,
                    "stat": a.stat, "time_us": stat([x[0] for x in got], a.stat),
                    "all_us": [x[0] for x in got], "ok": all(x[1] for x in got)})
            print(table(op, n, sizes, peers, cells, errors, a, c2cs, runner))
            print(flush=True)
    after = runner.c2c()
    if after is not None:
        print(f"# c2c one-way latency at the end: {after:.0f} ns; loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    jf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
