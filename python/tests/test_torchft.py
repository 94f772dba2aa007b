"""oxccl's torchft process group (skipped without torch or torchft)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchft")

from launch import run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_group_is_remade_at_every_quorum_and_fails_fast_when_a_replica_dies():
    results = run(3, "quorums", timeout=120, script="torchft_worker.py")
    assert results[1][0] == -9, results[1]
    for r in (0, 2):
        code, text = results[r]
        assert code == 0 and f"rank {r}: ok" in text, text


@pytest.mark.parametrize("replicas, seed", [(3, 11)])
def test_torchfts_ddp_trains_on_while_a_replica_is_killed_and_restarted(replicas, seed):
    example = os.path.join(HERE, "..", "examples", "torchft_ddp.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OXCCL_") or k == "OXCCL_FR_DIR"}
    done = subprocess.run([sys.executable, example, "--replicas", str(replicas), "--seed", str(seed), "--after", "10",
                           "--timeout", "150"], env=env, capture_output=True, text=True, timeout=200)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "killed replica" in out and "the same weights" in out, out
