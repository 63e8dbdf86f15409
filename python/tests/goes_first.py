"""The check the libraries' rank-0-first context managers share (Fabric's rank_zero_first,
Accelerate's main_process_first, Axolotl's zero_first): rank 0's body has finished before any
other rank's body starts."""
import os
import time


def check_rank_zero_first(context, rank, marker, what):
    """Enters `context` on this rank: rank 0 leaves `marker` after a pause, the others must find it."""
    with context:
        if rank == 0:
            time.sleep(0.2)
            open(marker, "w").close()
        else:
            assert os.path.exists(marker), f"{what}: a rank went before rank 0"
