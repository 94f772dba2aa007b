"""PyTorch's own distributed test suite (``DistributedTest._DistTestBase``, the class torch's
``test/distributed/test_distributed_spawn.py`` runs for each backend), with oxccl standing in
for gloo when ``OXCCL_STAND_IN=1``.

Run it as torch runs it: ``BACKEND=gloo WORLD_SIZE=N TEMP_DIR=... python -m pytest suite.py``.
With ``OXCCL_STAND_IN=1`` every process group torch would make on gloo (``init_process_group``,
``new_group``, subgroups, "cpu:gloo,cuda:..." configurations) is made on ``oxccl`` instead, as a
user who replaces "gloo" by "oxccl" gets; the tests still see ``BACKEND == "gloo"``, so they run
the cases written for gloo. ``scripts/ci/torch_suite.sh`` runs both and compares.

The patch is applied at import, so the ranks that torch's test harness spawns (which import
this module again) have it too.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

if os.environ.get("OXCCL_STAND_IN") == "1":
    import oxccl.torch  # noqa: F401  (registers the "oxccl" backend)

    _helper = c10d._new_process_group_helper

    def _oxccl_for_gloo(backend):
        """``backend`` with every "gloo" replaced by "oxccl" ("gloo", "cpu:gloo,cuda:nccl")."""
        text = str(backend)
        parts = [p.split(":") for p in text.split(",")]
        swapped = [":".join("oxccl" if x.strip().lower() == "gloo" else x for x in p) for p in parts]
        return ",".join(swapped) if "gloo" in text.lower() else backend

    def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        return _helper(group_size, group_rank, global_ranks_in_group, _oxccl_for_gloo(backend), *args, **kwargs)

    c10d._new_process_group_helper = _new_process_group_helper


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if os.environ.get("TORCH_SUITE_START", "spawn") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


if __name__ == "__main__":
    sys.exit(run_tests())
