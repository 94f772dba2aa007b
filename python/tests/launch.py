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


def run(n, scenario, timeout=60, env=None, script="worker.py"):
    port = _free_port()
    procs = []
    for r in range(n):
        # The caller's settings stay out, except where failed cases dump their flight
        # recorders (scripts/python_tests.sh keeps them out of /tmp).
        e = {k: v for k, v in os.environ.items() if not k.startswith("OXCCL_") or k == "OXCCL_FR_DIR"}
        e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OXCCL_SECRET="python-tests",
                 OXCCL_TIMEOUT="20s", PYTHONUNBUFFERED="1")
        e.update(env or {})
        args = [sys.executable, os.path.join(HERE, script)] + ([scenario] if scenario else [])
        procs.append(subprocess.Popen(args,
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
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
