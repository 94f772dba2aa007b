"""The torch.distributed backend ``oxccl`` (skipped without torch)."""

import pytest

pytest.importorskip("torch")

from launch import check, run  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective_matches_the_reference(n):
    assert all("ops ok" in t for t in check(run(n, "ops", timeout=240, script="torch_worker.py")))


def test_ddp_trains_like_gloo():
    assert all("ddp ok" in t for t in check(run(2, "ddp", timeout=240, script="torch_worker.py")))


@pytest.mark.parametrize("example, n", [("ddp_train.py", 2), ("fsdp2_train.py", 2), ("fsdp2_train.py", 3)])
def test_examples_end_with_gloos_parameters(example, n):
    out = check(run(n, "", timeout=300, script=f"../examples/{example}"))
    assert all("max parameter difference" in t for t in out), out
