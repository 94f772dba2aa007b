"""The torch.distributed backend ``oxccl`` (skipped without torch)."""

import pytest

pytest.importorskip("torch")

from launch import check, run  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective_matches_the_reference(n):
    assert all("ops ok" in t for t in check(run(n, "ops", timeout=240, script="torch_worker.py")))


@pytest.mark.parametrize("n", [2, 3])
def test_a_group_created_again_while_the_old_one_is_held_meets_its_own_ranks(n):
    assert all("reinit ok" in t for t in check(run(n, "reinit", timeout=120, script="torch_worker.py")))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_point_to_point_and_gloos_extras(n):
    assert all("p2p ok" in t for t in check(run(n, "p2p", timeout=240, script="torch_worker.py")))


def test_ddp_trains_like_gloo():
    assert all("ddp ok" in t for t in check(run(2, "ddp", timeout=240, script="torch_worker.py")))


@pytest.mark.parametrize("example, n", [("ddp_train.py", 2), ("fsdp2_train.py", 2), ("fsdp2_train.py", 3)])
def test_examples_end_with_gloos_parameters(example, n):
    out = check(run(n, "", timeout=300, script=f"../examples/{example}"))
    assert all("max parameter difference" in t for t in out), out


def test_cuda_tensors_choose_their_backend_from_the_settings():
    import oxccl
    from oxccl._oxccl import configured_backend
    from oxccl.torch import _cuda_backend

    assert [_cuda_backend("auto", rocm) for rocm in (False, True)] == ["nccl", "rccl"]
    assert [_cuda_backend(b, False) for b in ("nccl", "rccl", "cpu", "local")] == ["nccl", "rccl", None, None]
    assert configured_backend({"OXCCL_BACKEND": "rccl"}) == "rccl"
    with pytest.raises(oxccl.ConfigError, match="OXCCL_TIMEOUT"):
        configured_backend({"OXCCL_TIMEOUT": "soon"})


def test_cuda_tensors_fall_back_to_staging_where_nccl_cannot_load():
    import os
    from datetime import timedelta

    import torch
    from oxccl.torch import _create

    if os.path.exists("/dev/nvidia0"):
        pytest.skip("a GPU host: NCCL would load")
    pg = _create(torch.distributed.HashStore(), 0, 1, timedelta(seconds=20))
    with pytest.warns(UserWarning, match="staged through host memory.*libcuda"):
        assert pg._make_cuda(torch.device("cuda", 0)) is None
    # CPU tensors are untouched by it, on the cpu communicator.
    t = torch.arange(5.0)
    pg.allreduce([t]).wait()
    assert pg.comm.backend == "cpu" and t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
