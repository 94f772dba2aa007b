#!/usr/bin/env bash
# The TCP path across two emulated hosts, measured side by side in one run: two network
# namespaces joined by a veth pair (built as scripts/ci/two_hosts.sh builds them), ranks placed
# torchrun style (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR = host A's veth
# address), the first half of the ranks on host A and the second half on host B:
#   oxccl    `oxccl bench all_reduce` (cpu backend, float sum; TCP across the hosts, shared
#            memory within one), one process per rank
#   gloo     torch.distributed all_reduce with gloo (scripts/peers/gloo_bench.py --env), the
#            ranks placed the same way; oxccl and gloo alternate size by size
#   iperf3   what the veth itself carries, A->B: one stream, 4 streams (-P 4), one stream each
#            way at once (--bidir), and a plain socket stream (scripts/peers/tcp_stream.py,
#            the reference when iperf3 is missing), and a raw 8-byte socket ping-pong
#            (scripts/peers/tcp_pingpong.c: the 8 B rows of 2 ranks should be within 2x of it)
# for 1 and 2 ranks per host, in two modes: none (the bare veth) and shaped (both veth ends
# shaped like a 10 Gbit/s link with 50 us latency: tc qdisc netem delay 50us rate 10gbit;
# where netem is missing, tbf rate 10gbit, without the latency, and the output says so).
#
#   scripts/peers/compare_tcp.sh [--sizes 8,64K,1M,16M,64M] [--modes none,shaped]
#       [--ranks-per-host 1,2] [--iters-scale X] [--iperf-seconds S] [--timeout SECS]
#       [--json FILE] [--no-gloo] [--no-install]
#
# Prints one table, a row per (mode, ranks, size):
#   mode        none or shaped
#   ranks       ranks in all, (per host A + per host B): 2 = 1 per host, 4 = 2 per host
#   size        per-rank buffer (nccl-tests convention; K, M, G suffixes are binary)
#   oxccl µs    oxccl in place (as gloo's all_reduce is), maximum over ranks of the loop mean
#   oop µs      oxccl out of place, the same
#   gloo µs     gloo, timed the same way (same iterations and warm-up)
#   gloo/ox     gloo µs / oxccl µs (the issue asks for >= 2 at every size)
#   busbw GB/s  oxccl's bus bandwidth in place: size/time × 2(n−1)/n, decimal GB/s
#   %iperf3     busbw / iperf3's single stream A->B in the same mode (the issue: >= 80 at
#               >= 16 MiB); when iperf3 is missing, of the socket stream, marked so
#   %bidir      busbw / the slower direction of iperf3 --bidir in the same mode: what the
#               veth carries with both directions busy at once, as an all_reduce keeps them
#               (on one VM both emulated hosts share its CPUs; informational, not a target)
#   %10G        shaped mode: busbw / 1.25 GB/s, the 10 Gbit/s link rate (the issue: >= 90
#               at >= 16 MiB)
#   targets     ok, or which of the issue's three targets this row misses
# then the references per mode (GB/s: iperf3 1 stream, iperf3 -P 4, iperf3 --bidir A->B + B->A,
# socket stream), and the notes. Every measurement is also a JSON line in --json FILE (default
# target/peers/compare_tcp-DATE.jsonl; lines of earlier runs in the file are kept, each line
# names its run).
#
# Iterations adapt to the size: clamp(256 MiB / size, 5, 1000) × --iters-scale (at least 2),
# a tenth of that as warm-up; the default run takes a few minutes on 2 cores.
# Needs root and ip (iproute2); where network namespaces or veth devices are not permitted it
# prints SKIP and exits 0. It installs what is missing, idempotently (--no-install: nothing;
# a peer that is missing is then skipped with a note): iperf3 (apt), and for gloo the venv at
# ${PEERS_VENV:-target/peers-venv} with torch, as scripts/peers/compare_peers.sh does
# (PEERS_VENV=/path/to/venv reuses one that has torch; PEERS_TORCH_PIP overrides what pip is
# given). target/release/oxccl is built (cargo build --release -p oxccl-cli) when missing.
# OXCCL_* variables of the environment reach every rank (OXCCL_TIMEOUT defaults to 60s).
# The namespaces, the veth pair, its qdiscs and every process started in them are removed on
# exit, Ctrl-C and failure included; their names carry this script's PID.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
VENV=${PEERS_VENV:-target/peers-venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
LOG="$TARGET/peers/install.log"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
say() { echo "compare_tcp: $*" >&2; }
die() { say "$*"; exit 2; }

SIZES_ARG="8,64K,1M,16M,64M"
MODES="none,shaped"
RPH="1,2"
ITERS_SCALE=1
IPERF_SECONDS=3
LIMIT=180
JSONL=""
GLOO=1 INSTALL=1
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage; exit 0 ;;
    --no-gloo) GLOO=0; shift ;;
    --no-install) INSTALL=0; shift ;;
    --sizes | --modes | --ranks-per-host | --iters-scale | --iperf-seconds | --timeout | --json)
        [ $# -ge 2 ] || die "$1 needs a value (see --help)"
        set -- "$1=$2" "${@:3}" ;;
    --sizes=*) SIZES_ARG=${1#*=}; shift ;;
    --modes=*) MODES=${1#*=}; shift ;;
    --ranks-per-host=*) RPH=${1#*=}; shift ;;
    --iters-scale=*) ITERS_SCALE=${1#*=}; shift ;;
    --iperf-seconds=*) IPERF_SECONDS=${1#*=}; shift ;;
    --timeout=*) LIMIT=${1#*=}; shift ;;
    --json=*) JSONL=${1#*=}; shift ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done

# --- Arguments.
to_bytes() { # 64K -> 65536 (binary suffixes, as oxccl bench reads them)
    local v=$1 n unit
    [[ "$v" =~ ^([0-9]+)([KkMmGg]?)(i?[Bb])?$ ]] || return 1
    n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
    case "$unit" in
    K | k) n=$((n << 10)) ;;
    M | m) n=$((n << 20)) ;;
    G | g) n=$((n << 30)) ;;
    esac
    [ "$n" -ge 4 ] || return 1
    echo "$n"
}
SIZES=()
for s in ${SIZES_ARG//,/ }; do
    b=$(to_bytes "$s") || die "bad size $s in --sizes (bytes, at least 4, with an optional K, M or G suffix)"
    SIZES+=("$b")
done
[ ${#SIZES[@]} -gt 0 ] || die "--sizes is empty"
for m in ${MODES//,/ }; do
    case "$m" in none | shaped) ;; *) die "unknown mode $m in --modes (none, shaped)" ;; esac
done
for p in ${RPH//,/ }; do
    [[ "$p" =~ ^[1-9][0-9]*$ ]] || die "bad --ranks-per-host $p (positive integers)"
done
if ! [[ "$ITERS_SCALE" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || ! awk -v k="$ITERS_SCALE" 'BEGIN { exit !(k > 0) }'; then
    die "bad --iters-scale $ITERS_SCALE (a positive number)"
fi
[[ "$IPERF_SECONDS" =~ ^[1-9][0-9]*$ ]] || die "bad --iperf-seconds $IPERF_SECONDS (whole seconds)"
[[ "$LIMIT" =~ ^[1-9][0-9]*$ ]] || die "bad --timeout $LIMIT (whole seconds)"
[ -n "$JSONL" ] || JSONL="$TARGET/peers/compare_tcp-$(date +%Y%m%d-%H%M%S).jsonl"
case "$JSONL" in /*) ;; *) JSONL="$ROOT/$JSONL" ;; esac

[ "$(id -u)" = 0 ] || { echo "compare_tcp: SKIP: needs root to create network namespaces"; exit 0; }
command -v ip >/dev/null 2>&1 || { echo "compare_tcp: SKIP: ip (iproute2) is not installed"; exit 0; }
command -v python3 >/dev/null 2>&1 || die "python3 is needed (the table, the socket stream)"
mkdir -p "$TARGET/peers" "$(dirname "$JSONL")" || die "cannot create $(dirname "$JSONL")"

# --- Names of this run (the PID makes them unique), and the cleanup of everything made here.
TAG=$$
NS_A="oxccl-tcp-a-$TAG"
NS_B="oxccl-tcp-b-$TAG"
VA="oxta$TAG"
VB="oxtb$TAG"
ADDR_A=10.232.$((TAG % 250)).1
ADDR_B=10.232.$((TAG % 250)).2
RUN="$(date -u +%Y%m%dT%H%M%SZ)-$TAG"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/compare_tcp.XXXXXX") || die "mktemp failed"
PIDS=()
NOTES=()
note() { NOTES+=("$*"); say "note: $*"; }

cleanup() {
    local p ns
    trap - INT TERM HUP
    disown -a 2>/dev/null # no job notices for what is killed here
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for ns in "$NS_A" "$NS_B"; do
        [ -e "/var/run/netns/$ns" ] || [ -e "/run/netns/$ns" ] || continue
        # Anything still running inside our own namespace was started by this script.
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true # takes its end of the veth and its qdisc with it
    done
    ip link del "$VA" 2>/dev/null || true # only if it never left the root namespace
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# --- Tools: iperf3, torch (gloo), oxccl.
PY="$VENV/bin/python"
# shellcheck source=scripts/peers/install.sh
. scripts/peers/install.sh
if ! command -v iperf3 >/dev/null 2>&1; then
    apt_install iperf3 || true
fi
HAVE_IPERF=0
if command -v iperf3 >/dev/null 2>&1; then
    HAVE_IPERF=1
else
    if [ "$INSTALL" = 1 ]; then why="apt-get install iperf3 failed; see $LOG"; else why="--no-install"; fi
    note "no iperf3 ($why): %iperf3 is of the python socket stream instead"
fi

GLOO_CHECK='import torch.distributed as d; assert d.is_available() and d.is_gloo_available()'
if [ "$GLOO" = 1 ]; then
    ensure_venv || true
    if [ -x "$PY" ] && ! vpy "$GLOO_CHECK" && [ "$INSTALL" = 1 ]; then
        vpy "import numpy" || pip_install numpy
        say "installing torch for gloo: PyPI's wheel for this platform, gigabytes with its CUDA libraries; --no-gloo skips it"
        # shellcheck disable=SC2086 # PEERS_TORCH_PIP is a list of pip arguments
        pip_install ${PEERS_TORCH_PIP:-torch}
    fi
    if ! [ -x "$PY" ] || ! vpy "$GLOO_CHECK"; then
        if [ "$INSTALL" = 1 ]; then why="pip install ${PEERS_TORCH_PIP:-torch} into $VENV failed; see $LOG"; else why="--no-install"; fi
        note "gloo skipped: no torch with gloo in $VENV ($why)"
        GLOO=0
    fi
else
    note "gloo not run (--no-gloo)"
fi

OXCCL="$TARGET/release/oxccl"
if [ ! -x "$OXCCL" ]; then
    say "building oxccl (cargo build --release -p oxccl-cli; log in $LOG)"
    CARGO_TARGET_DIR="$TARGET" cargo build --release -p oxccl-cli >>"$LOG" 2>&1 || die "cargo build --release -p oxccl-cli failed (see $LOG)"
fi

# --- The two hosts.
ip netns add "$NS_A" 2>/dev/null || { echo "compare_tcp: SKIP: ip netns is not permitted here (no CAP_SYS_ADMIN?)"; exit 0; }
ip netns add "$NS_B" || die "ip netns add $NS_B failed"
ip link add "$VA" type veth peer name "$VB" 2>/dev/null || { echo "compare_tcp: SKIP: veth devices are not permitted here"; exit 0; }
if ! { ip link set "$VA" netns "$NS_A" && ip link set "$VB" netns "$NS_B" &&
    ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VA" && ip -n "$NS_B" addr add "$ADDR_B/24" dev "$VB" &&
    ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up &&
    ip -n "$NS_A" link set "$VA" up && ip -n "$NS_B" link set "$VB" up; }; then
    die "could not set up the veth pair"
fi
say "hosts: $NS_A ($VA $ADDR_A) and $NS_B ($VB $ADDR_B); JSON lines in $JSONL"
SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
PORT=20000

# --- Shaping: netem as the issue asks; tbf (rate only) where netem is missing.
NETEM=(netem delay 50us rate 10gbit)
TBF=(tbf rate 10gbit burst 256kb latency 5ms)
SHAPE=()
SHAPER="none"
try_qdisc() { # try_qdisc QDISC ARGS...: 0 when it can be added (it is removed again)
    ip netns exec "$NS_A" tc qdisc add dev "$VA" root "$@" 2>>"$WORK/tc.log" || return 1
    ip netns exec "$NS_A" tc qdisc del dev "$VA" root 2>>"$WORK/tc.log"
    return 0
}
if [[ ",$MODES," == *",shaped,"* ]]; then
    if ! command -v tc >/dev/null 2>&1; then
        note "no tc (iproute2): the shaped mode is skipped"
    elif try_qdisc "${NETEM[@]}"; then
        SHAPE=("${NETEM[@]}")
    elif command -v modprobe >/dev/null 2>&1 && modprobe sch_netem >>"$WORK/tc.log" 2>&1 && try_qdisc "${NETEM[@]}"; then
        SHAPE=("${NETEM[@]}")
    else
        why=$(tail -n 1 "$WORK/tc.log" 2>/dev/null)
        command -v modprobe >/dev/null 2>&1 || why="$why; no modprobe"
        if try_qdisc "${TBF[@]}"; then
            SHAPE=("${TBF[@]}")
            note "netem is not available here ($why): shaped = tc qdisc ${TBF[*]} on both veth ends, the 10 Gbit/s rate without the 50 us latency"
        else
            note "neither netem nor tbf can be added here ($why): the shaped mode is skipped"
        fi
    fi
    [ ${#SHAPE[@]} -gt 0 ] && SHAPER="${SHAPE[*]}"
fi
shape() { # shape on|off
    local ns dev
    for ns in "$NS_A" "$NS_B"; do
        if [ "$ns" = "$NS_A" ]; then dev=$VA; else dev=$VB; fi
        if [ "$1" = on ]; then
            ip netns exec "$ns" tc qdisc add dev "$dev" root "${SHAPE[@]}" || return 1
        else
            ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null
        fi
    done
    return 0
}

# --- Records and the table (python3; JSON lines in $JSONL).
REPORT_PY=$(
    cat <<'PY'
import json
import sys


def value(v):
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v


def last_json(path):
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.startswith("{")]
    if not lines:
        raise ValueError("no JSON line in the output")
    return json.loads(lines[-1])


def tail(path, n=3):
    try:
        with open(path) as f:
            return " | ".join(ln.strip() for ln in f.read().splitlines()[-n:])[:400]
    except OSError:
        return ""


def busbw(nbytes, us, n):
    return nbytes / us / 1e3 * 2 * (n - 1) / n if us > 0 else None


def record(jsonl, tool, raw, args):
    ctx = {"run": None, "tool": tool}
    for kv in args:
        k, v = kv.split("=", 1)
        ctx[k] = v if k in ("error", "shaper", "run", "mode") else value(v)
    recs = []
    try:
        if "error" in ctx:
            raise RuntimeError(ctx.pop("error"))
        if tool == "oxccl":
            with open(raw) as f:
                d = json.load(f)
            for row in d["rows"]:
                recs.append(dict(ctx, in_place=row["in_place"], time_us=row["time_us"], iters=row["iters"],
                                 busbw_gbps=row["busbw_gbps"], algbw_gbps=row["algbw_gbps"],
                                 algorithm=row.get("algorithm"), wrong=row["wrong"], version=d.get("version")))
        elif tool == "gloo":
            d = last_json(raw)
            if "error" in d:
                raise RuntimeError(d["error"])
            recs.append(dict(ctx, in_place=True, time_us=d["time_us"], bytes=d["bytes"],
                             busbw_gbps=busbw(d["bytes"], d["time_us"], d["world"]), ok=d["ok"],
                             version=d.get("version")))
        elif tool in ("iperf3", "iperf3_bidir"):
            with open(raw) as f:
                d = json.load(f)
            if d.get("error"):
                raise RuntimeError("iperf3: " + d["error"])
            end = d["end"]
            r = dict(ctx, gbps=end["sum_received"]["bits_per_second"] / 8e9,
                     sent_gbps=end["sum_sent"]["bits_per_second"] / 8e9,
                     retransmits=end["sum_sent"].get("retransmits"),
                     seconds=end["sum_received"].get("seconds"),
                     version=d.get("start", {}).get("version"))
            if tool == "iperf3_bidir":  # B->A at the same time
                r["reverse_gbps"] = end["sum_received_bidir_reverse"]["bits_per_second"] / 8e9
            recs.append(r)
        elif tool == "tcp_stream":
            d = last_json(raw)
            if "error" in d:
                raise RuntimeError(d["error"])
            recs.append(dict(ctx, gbps=d["gbps"], bytes=d["bytes"], seconds=d["seconds"]))
        elif tool == "tcp_pingpong":
            d = last_json(raw)
            recs.append(dict(ctx, rtt_us=d["rtt_us"], iters=d["iters"]))
        else:
            recs.append(ctx)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        log = tail(raw) if raw else ""
        recs = [dict(ctx, error=f"{e}" + (f" (output: {log})" if log and log not in f"{e}" else ""))]
    with open(jsonl, "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    r = [x for x in recs if x.get("in_place", True)][-1]
    if "error" in r:
        return f"{tool} error: {r['error'][:160]}"
    if "time_us" in r:
        return f"{tool} {r['time_us']:.1f} us"
    if "rtt_us" in r:
        return f"{tool} round trip {r['rtt_us']:.1f} us"
    if "reverse_gbps" in r:
        return f"{tool} {r['gbps']:.3f} + {r['reverse_gbps']:.3f} GB/s"
    return f"{tool} {r['gbps']:.3f} GB/s"


def human(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def table(jsonl, run):
    with open(jsonl) as f:
        recs = [r for r in (json.loads(ln) for ln in f if ln.strip()) if r.get("run") == run]
    meta = next((r for r in recs if r["tool"] == "meta"), {})
    modes = []
    for r in recs:
        if r.get("mode") and r["mode"] not in modes and r["tool"] != "meta":
            modes.append(r["mode"])
    refs = {}
    for r in recs:
        if r["tool"] in ("iperf3", "iperf3_bidir", "tcp_stream", "tcp_pingpong"):
            refs[(r["mode"], r["tool"], r.get("streams", 1))] = r
    rows, order = {}, []
    for r in recs:
        if r["tool"] not in ("oxccl", "gloo"):
            continue
        key = (r["mode"], r["ranks"], r["per_host"], r["bytes"])
        if key not in rows:
            rows[key] = {}
            order.append(key)
        place = "in" if r.get("in_place", True) else "oop"
        rows[key][(r["tool"], place)] = r
    link = 1.25  # GB/s: 10 Gbit/s
    head = (f"{'mode':<7} {'ranks':<8} {'size':>8} {'oxccl µs':>10} {'oop µs':>10} {'gloo µs':>10} "
            f"{'gloo/ox':>8} {'busbw GB/s':>10} {'%iperf3':>8} {'%bidir':>7} {'%10G':>6}  targets")
    print(head)
    print("-" * len(head))
    errors = []
    used_stream = False

    def t(r):
        if r is None:
            return "-"
        if "error" in r:
            errors.append(r)
            return "error"
        return f"{r['time_us']:.1f}"

    for key in order:
        mode, ranks, per, nbytes = key
        d = rows[key]
        ox, oop, gl = d.get(("oxccl", "in")), d.get(("oxccl", "oop")), d.get(("gloo", "in"))
        ref = refs.get((mode, "iperf3", 1))
        mark = ""
        if ref is None or "error" in ref:
            ref, mark = refs.get((mode, "tcp_stream", 1)), "s"
            used_stream = used_stream or ref is not None
        if ref is not None and "error" in ref:
            ref = None
        ok_ox = ox is not None and "error" not in ox
        ok_gl = gl is not None and "error" not in gl
        ratio = gl["time_us"] / ox["time_us"] if ok_ox and ok_gl else None
        bw = ox["busbw_gbps"] if ok_ox else None
        pref = 100 * bw / ref["gbps"] if bw is not None and ref else None
        plink = 100 * bw / link if bw is not None and mode == "shaped" else None
        both = refs.get((mode, "iperf3_bidir", 1))
        slower = min(both["gbps"], both.get("reverse_gbps", both["gbps"])) if both and "error" not in both else None
        pboth = 100 * bw / slower if bw is not None and slower else None
        miss = []
        if ratio is not None and ratio < 2:
            miss.append("<2x gloo")
        if nbytes >= 16 << 20 and pref is not None and pref < 80:
            miss.append("<80% iperf3")
        if nbytes >= 16 << 20 and plink is not None and plink < 90:
            miss.append("<90% link")
        rtt = refs.get((mode, "tcp_pingpong", 1))
        if nbytes <= 8 and ranks == 2 and ok_ox and rtt and "rtt_us" in rtt and ox["time_us"] > 2 * rtt["rtt_us"]:
            miss.append(">2x ping-pong")
        verdict = "ok" if ok_ox and not miss else ("miss: " + ", ".join(miss) if miss else "-")
        print(f"{mode:<7} {f'{ranks} ({per}+{per})':<8} {human(nbytes):>8} {t(ox):>10} {t(oop):>10} {t(gl):>10} "
              f"{'-' if ratio is None else f'{ratio:.2f}':>8} {'-' if bw is None else f'{bw:.3f}':>10} "
              f"{'-' if pref is None else f'{pref:.0f}{mark}':>8} {'-' if pboth is None else f'{pboth:.0f}':>7} "
              f"{'-' if plink is None else f'{plink:.0f}':>6}  "
              f"{verdict}")
    print()
    print("references over the veth, GB/s (bytes received, decimal), A->B unless marked:")
    for mode in modes:
        parts = []
        for tool, streams, label in (("iperf3", 1, "iperf3 1 stream"), ("iperf3", 4, "iperf3 -P 4"),
                                     ("iperf3_bidir", 1, "iperf3 --bidir"), ("tcp_stream", 1, "socket stream")):
            r = refs.get((mode, tool, streams))
            if r is None:
                continue
            if "error" in r:
                errors.append(r)
                parts.append(f"{label} error")
            else:
                rt = r.get("retransmits")
                fig = f"{r['gbps']:.3f}"
                if "reverse_gbps" in r:
                    fig = f"A->B {fig} + B->A {r['reverse_gbps']:.3f}"
                parts.append(f"{label} {fig}" + (f" ({rt} retr.)" if rt else ""))
        rtt = refs.get((mode, "tcp_pingpong", 1))
        if rtt is not None:
            parts.append("8 B socket ping-pong " + (f"round trip {rtt['rtt_us']:.1f} us" if "rtt_us" in rtt else "error"))
        shaper = meta.get("shaper", "") if mode == "shaped" else "bare veth"
        print(f"  {mode:<7} [{shaper}]")
        print(f"          {';  '.join(parts) or '-'}")
    if any(k[0] == "shaped" for k in order):
        print("  shaped  link rate 10 Gbit/s = 1.250 GB/s (the %10G column)")
    notes = meta.get("notes") or []
    if used_stream:
        notes.append("%iperf3 marked s: of the socket stream, iperf3 having no figure in that mode")
    for e in errors:
        what = " ".join(str(e.get(k)) for k in ("tool", "mode", "ranks", "bytes", "streams") if k in e)
        notes.append(f"{what}: {e['error'][:300]}")
    for n in notes:
        print(f"note: {n}")


if __name__ == "__main__":
    if sys.argv[1] == "record":
        print(record(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]))
    elif sys.argv[1] == "meta":  # meta JSONL KEY=VALUE... -- NOTE...
        args = sys.argv[3:]
        cut = args.index("--")
        rec = {"tool": "meta"}
        for kv in args[:cut]:
            k, v = kv.split("=", 1)
            rec[k] = int(v) if k in ("nproc", "seconds") else v
        rec["notes"] = args[cut + 1:]
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps(rec) + "\n")
    else:
        table(sys.argv[2], sys.argv[3])
PY
)
report() { python3 -c "$REPORT_PY" "$@"; }
# rec TOOL RAWFILE KEY=VALUE...: one or more JSON lines; prints a one-line summary.
rec() { report record "$JSONL" "$1" "$2" "run=$RUN" "${@:3}"; }

# run_world NAME PER_HOST CMD...: 2×PER_HOST ranks, 0..PER_HOST-1 on host A, the rest on host B;
# their output in $WORK/NAME.RANK.log. 0 when every rank exited 0, else the first failure's
# code; when a rank fails the others get 5 s before they are killed, and a world that runs
# past --timeout is killed (124).
run_world() {
    local name=$1 per=$2 world=$(($2 * 2)) rank ns dev i rc=0 start=$SECONDS fail_at="" left pids=() codes=()
    shift 2
    PORT=$((PORT + 4)) # the store on PORT (gloo) or PORT+1 (oxccl); fresh ones for every world
    for ((rank = 0; rank < world; rank++)); do
        if [ "$rank" -lt "$per" ]; then ns=$NS_A dev=$VA; else ns=$NS_B dev=$VB; fi
        ip netns exec "$ns" env RANK="$rank" WORLD_SIZE="$world" LOCAL_RANK=$((rank % per)) LOCAL_WORLD_SIZE="$per" \
            MASTER_ADDR="$ADDR_A" MASTER_PORT="$PORT" OXCCL_SECRET="$SECRET" OXCCL_TIMEOUT="${OXCCL_TIMEOUT:-60s}" \
            OXCCL_SOCKET_IFNAME="=$dev" GLOO_SOCKET_IFNAME="$dev" OMP_NUM_THREADS=1 \
            "$@" >"$WORK/$name.$rank.log" 2>&1 &
        pids+=("$!")
        PIDS+=("$!")
    done
    left=$world
    while [ "$left" -gt 0 ]; do
        for i in "${!pids[@]}"; do
            [ -z "${codes[i]:-}" ] || continue
            kill -0 "${pids[i]}" 2>/dev/null && continue
            wait "${pids[i]}" 2>/dev/null
            codes[i]=$?
            left=$((left - 1))
            if [ "${codes[i]}" != 0 ] && [ -z "$fail_at" ]; then fail_at=$SECONDS rc=${codes[i]}; fi
        done
        [ "$left" -gt 0 ] || break
        if [ $((SECONDS - start)) -ge "$LIMIT" ] || { [ -n "$fail_at" ] && [ $((SECONDS - fail_at)) -ge 5 ]; }; then
            [ -n "$fail_at" ] || rc=124
            for i in "${!pids[@]}"; do
                [ -n "${codes[i]:-}" ] || { kill -9 "${pids[i]}" 2>/dev/null; wait "${pids[i]}" 2>/dev/null; }
            done
            break
        fi
        sleep 0.2
    done
    PIDS=()
    return "$rc"
}
world_error() { # world_error NAME RC: why a world failed, from its ranks' logs
    local name=$1 rc=$2 f why=""
    [ "$rc" = 124 ] && why="killed after ${LIMIT}s (--timeout); "
    for f in "$WORK/$name".*.log; do
        [ -s "$f" ] || continue
        why="$why${f##*/}: $(grep -v '^#' "$f" | tail -n 2 | tr '\n' ' ' | cut -c1-200); "
    done
    echo "exit $rc; $why"
}

# iters_for SIZE: "ITERS WARMUP" for both peers.
iters_for() {
    awk -v s="$1" -v k="$ITERS_SCALE" 'BEGIN {
        n = 268435456 / s; if (n > 1000) n = 1000; if (n < 5) n = 5
        n = int(n * k + 0.5); if (n < 2) n = 2
        w = int(n / 10); if (w < 1) w = 1
        print n, w }'
}

# measure_refs MODE: iperf3 A->B (1 stream, 4 streams, 1 stream each way at once) and the socket
# stream, A->B.
measure_refs() {
    local mode=$1 how streams tool srv try out args
    if [ "$HAVE_IPERF" = 1 ]; then
        for how in 1 4 bidir; do
            streams=${how/bidir/1} tool=iperf3 args=(-P "$streams")
            [ "$how" != bidir ] || tool=iperf3_bidir args=(--bidir)
            PORT=$((PORT + 4))
            out="$WORK/iperf3.$mode.$how.json"
            ip netns exec "$NS_B" iperf3 -s -1 -B "$ADDR_B" -p "$PORT" >"$WORK/iperf3-server.log" 2>&1 &
            srv=$!
            PIDS+=("$srv")
            sleep 0.3
            for try in 1 2 3; do
                ip netns exec "$NS_A" iperf3 -c "$ADDR_B" -B "$ADDR_A" -p "$PORT" -t "$IPERF_SECONDS" "${args[@]}" -J \
                    >"$out" 2>>"$WORK/iperf3-client.log" && break
                [ "$try" = 3 ] || sleep 0.5
            done
            kill -9 "$srv" 2>/dev/null
            wait "$srv" 2>/dev/null
            PIDS=()
            say "$mode: $(rec "$tool" "$out" "mode=$mode" "shaper=$SHAPER_NOW" "streams=$streams" \
                "seconds_asked=$IPERF_SECONDS")"
        done
    fi
    PORT=$((PORT + 4))
    out="$WORK/stream.$mode.json"
    ip netns exec "$NS_B" python3 scripts/peers/tcp_stream.py server --bind "$ADDR_B" --port "$PORT" \
        >"$WORK/stream-server.log" 2>&1 &
    srv=$!
    PIDS+=("$srv")
    ip netns exec "$NS_A" python3 scripts/peers/tcp_stream.py client --connect "$ADDR_B" --port "$PORT" \
        --seconds "$IPERF_SECONDS" >"$out" 2>&1
    kill -9 "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    PIDS=()
    say "$mode: $(rec tcp_stream "$out" "mode=$mode" "shaper=$SHAPER_NOW" "streams=1")"
    if [ -x "$PINGPONG" ]; then
        PORT=$((PORT + 4))
        out="$WORK/pingpong.$mode.json"
        ip netns exec "$NS_B" "$PINGPONG" server "$ADDR_B" "$PORT" 20000 >"$WORK/pingpong-server.log" 2>&1 &
        srv=$!
        PIDS+=("$srv")
        ip netns exec "$NS_A" "$PINGPONG" client "$ADDR_B" "$PORT" 20000 >"$out" 2>&1
        kill -9 "$srv" 2>/dev/null
        wait "$srv" 2>/dev/null
        PIDS=()
        say "$mode: $(rec tcp_pingpong "$out" "mode=$mode" "shaper=$SHAPER_NOW" "streams=1")"
    fi
}

# The raw socket ping-pong (scripts/peers/tcp_pingpong.c), the reference for 8-byte rows.
PINGPONG="$WORK/tcp_pingpong"
if ! { command -v cc >/dev/null 2>&1 && cc -O2 -o "$PINGPONG" scripts/peers/tcp_pingpong.c 2>"$WORK/pingpong-build.log"; }; then
    note "no C compiler (cc): the 8-byte rows are not compared with a socket ping-pong"
    PINGPONG=""
fi

# --- The measurements: per mode the references, then per world oxccl and gloo size by size.
T0=$SECONDS
for mode in ${MODES//,/ }; do
    SHAPER_NOW="none"
    if [ "$mode" = shaped ]; then
        [ ${#SHAPE[@]} -gt 0 ] || continue
        if ! shape on; then
            note "tc qdisc add ... ${SHAPE[*]} failed on the veth: the shaped mode is skipped"
            shape off
            continue
        fi
        SHAPER_NOW=$SHAPER
    fi
    measure_refs "$mode"
    for per in ${RPH//,/ }; do
        world=$((2 * per))
        for size in "${SIZES[@]}"; do
            read -r iters warm < <(iters_for "$size")
            ctx=("mode=$mode" "shaper=$SHAPER_NOW" "ranks=$world" "per_host=$per" "bytes=$size" "warmup=$warm")
            run_world oxccl "$per" "$OXCCL" bench all_reduce --backend cpu -d float -o sum \
                -b "$size" -e "$size" -n "$iters" -w "$warm" --json "$WORK/oxccl.json"
            rc=$?
            rm -f "$WORK/oxccl.err"
            [ "$rc" = 0 ] || world_error oxccl "$rc" >"$WORK/oxccl.err"
            if [ -s "$WORK/oxccl.err" ]; then
                line=$(rec oxccl "" "${ctx[@]}" "iters=$iters" "error=$(cat "$WORK/oxccl.err")")
            else
                line=$(rec oxccl "$WORK/oxccl.json" "${ctx[@]}" "iters=$iters")
            fi
            rm -f "$WORK/oxccl.json"
            if [ "$GLOO" = 1 ]; then
                run_world gloo "$per" "$PY" scripts/peers/gloo_bench.py --env --op all_reduce \
                    --bytes "$size" --iters "$iters" --warmup "$warm" --timeout "$LIMIT"
                rc=$?
                if [ "$rc" = 0 ]; then
                    line="$line, $(rec gloo "$WORK/gloo.0.log" "${ctx[@]}" "iters=$iters")"
                else
                    why=$(world_error gloo "$rc")
                    line="$line, $(rec gloo "$WORK/gloo.0.log" "${ctx[@]}" "iters=$iters" "error=$why")"
                fi
            fi
            say "$mode, $world ranks ($per per host), $size B, $iters iterations: $line"
        done
    done
    [ "$mode" = shaped ] && shape off
done
ELAPSED=$((SECONDS - T0))
for per in ${RPH//,/ }; do
    if [ $((2 * per)) -gt "$(nproc)" ]; then
        note "$((2 * per)) ranks share $(nproc) CPUs: the two emulated hosts share them (so does the kernel's" \
            "network work), and both directions of every link cross the same CPUs; real hosts each have their own"
    fi
done
OXENV=$(env | grep -E '^(OXCCL_|GLOO_|TORCH_)' | grep -v '^OXCCL_SECRET=' | sort | tr '\n' ' ')
[ -z "$OXENV" ] || note "from the environment, to every rank: $OXENV"
NOTES+=("measured in ${ELAPSED}s on $(nproc) CPUs; iterations clamp(256 MiB / size, 5, 1000) x $ITERS_SCALE; JSON lines (run $RUN) in $JSONL")
report meta "$JSONL" "run=$RUN" "date=$(date -u +%FT%TZ)" "kernel=$(uname -r)" "nproc=$(nproc)" "shaper=$SHAPER" \
    "oxccl=$("$OXCCL" --version 2>/dev/null | head -n 1)" "sizes=$SIZES_ARG" "modes=$MODES" "ranks_per_host=$RPH" \
    "iters_scale=$ITERS_SCALE" "seconds=$ELAPSED" -- "${NOTES[@]}"

echo
echo "compare_tcp: all_reduce float sum across two network namespaces over a veth pair ($NS_A, $NS_B)"
report table "$JSONL" "$RUN"
