"""Axolotl's distributed utilities (axolotl.utils.distributed, seed 003) on backend chorus.
Axolotl 0.19 pins torch <= 2.13 but pulls dozens of training packages; the project installs it
with --no-deps (python/requirements-nodeps.txt) plus what this module imports (accelerate,
transformers). Axolotl builds on Accelerate's PartialState, so the group is started first, as for
Accelerate (accelerate_on_chorus.py): then PartialState(cpu=True), which Axolotl's own
PartialState() finds already made.

  PYTHONPATH=<build>/python/site .venv/bin/python python/tests/test_axolotl.py [-v]"""
import os
import tempfile
import unittest

import torch
import torch.distributed as dist

from goes_first import check_rank_zero_first
from ranks import run_ranks


def axolotl_calls(rank, world):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    from accelerate import PartialState

    PartialState(cpu=True)
    from axolotl.utils import distributed as ax

    assert ax.is_distributed() and dist.get_backend() == "chorus"
    assert ax.is_main_process() == (rank == 0) and ax.get_world_size() == world
    calls = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    before = calls._get_sequence_number_for_group()

    ax.barrier()
    # zero_first: rank 0's body has finished before any other rank's starts.
    marker = os.path.join(tempfile.gettempdir(), f"chorus-axolotl-{os.getppid()}")  # the ranks' common parent
    check_rank_zero_first(ax.zero_first(ax.is_main_process()), rank, marker, "zero_first")
    ax.barrier()
    if rank == 0:
        os.unlink(marker)

    assert ax.compute_and_broadcast(lambda: 41 + 1 if rank == 0 else -1) == 42
    assert ax.compute_and_broadcast(lambda: 2.5) == 2.5
    got = ax.gather_scalar_from_all_ranks(lambda: rank * 10, world_size=world)
    assert got == ([r * 10 for r in range(world)] if rank == 0 else None), got
    got = ax.gather_from_all_ranks(lambda: rank + 0.5, world_size=world)
    assert got == ([r + 0.5 for r in range(world)] if rank == 0 else None), got
    assert ax.reduce_and_broadcast(lambda: rank + 1, sum) == world * (world + 1) // 2
    assert ax.reduce_and_broadcast(lambda: float(rank), max) == world - 1
    assert ax.broadcast_dict({"from": rank, "text": "x" * 3000 * (rank + 1)}) == {"from": 0, "text": "x" * 3000}
    assert calls._get_sequence_number_for_group() - before >= 15  # it all went through chorus





class Axolotl(unittest.TestCase):
    def test_distributed_utilities(self):
        run_ranks(axolotl_calls, world=3)


if __name__ == "__main__":
    unittest.main()
