"""Runs a scenario of ``worker.py`` on N processes as torchrun would start them (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/MASTER_PORT, a shared OXCCL_SECRET) and returns each
rank's exit code and output."""

import os
import random
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    while True:
        p = random.randint(20000, 40000)
        try:
            for q in (p, p + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue


def _start(r, n, port, scenario, env, script):
    # The caller's settings stay out, except where failed cases dump their flight
    # recorders (scripts/ci/python_tests.sh keeps them out of /tmp).
    e = {k: v for k, v in os.environ.items() if not k.startswith("OXCCL_") or k == "OXCCL_FR_DIR"}
    e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
             MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OXCCL_SECRET="python-tests",
             OXCCL_TIMEOUT="20s", PYTHONUNBUFFERED="1")
    e.update(env or {})
    args = [sys.executable, os.path.join(HERE, script)] + ([scenario] if scenario else [])
    return subprocess.Popen(args, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_replacing(n, scenario, timeout=60, script="worker.py", env=None):
    """As :func:`run`, and like ``oxccl run --max-restarts 1``: when a rank exits with an
    error, a replacement (``OXCCL_JOIN=1``) starts in its slot. Results: the n ranks', then
    the replacement's."""
    import time
    port = _free_port()
    procs = [_start(r, n, port, scenario, env, script) for r in range(n)]
    deadline = time.monotonic() + timeout
    replaced = None
    while replaced is None and time.monotonic() < deadline:
        for r, p in enumerate(procs):
            if p.poll() not in (None, 0):
                replaced = r
                break
        time.sleep(0.01)
    if replaced is not None:
        procs.append(_start(replaced, n, port, scenario, dict(env or {}, OXCCL_JOIN="1"), script))
    return _collect(procs, timeout)


def run(n, scenario, timeout=60, env=None, script="worker.py"):
    port = _free_port()
    procs = [_start(r, n, port, scenario, env, script) for r in range(n)]
    return _collect(procs, timeout)


def _collect(procs, timeout):
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text, _ = p.communicate()
            text += "\n(killed: the scenario hung)"
        out.append((p.returncode, text))
    return out


def check(results):
    bad = [(r, code, text) for r, (code, text) in enumerate(results) if code != 0]
    assert not bad, "\n".join(f"rank {r} exited {code}:\n{text}" for r, code, text in bad)
    return [text for _, text in results]
