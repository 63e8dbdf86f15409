#!/usr/bin/env python3
"""torch's object collectives: broadcast_object_list of a dict holding 100 MB of f32 tensors (four
of 25 MB), against broadcasting the same four tensors with dist.broadcast. chorus's C++ object
broadcast runs the same dict in chorus-torch-bench.

  bench/peers/torch_objects.py [WORLD] [--backend gloo|chorus]

Prints rank 0's median over 5 runs of each, in ms."""
import torch
import torch.distributed as dist

import common


def body(rank, world, backend, args):
    tensors = [torch.full((25 * 1024 * 1024 // 4,), float(rank)) for _ in range(4)]
    obj = {f"t{i}": t for i, t in enumerate(tensors)}

    def broadcast_object():
        holder = [obj if rank == 0 else None]
        dist.broadcast_object_list(holder, src=0)
        assert float(holder[0]["t3"][0]) == 0.0, "the dict did not come from rank 0"

    def broadcast_tensors():
        for t in tensors:
            dist.broadcast(t, 0)

    for name, fn in (("broadcast_object_list_100MB_dict", broadcast_object), ("broadcast_raw_100MB", broadcast_tensors)):
        t = common.median_seconds(fn, 5, warmup=1)
        if rank == 0:
            print(f"torch_{backend} {name} world={world} median_ms={t * 1e3:.1f}")


if __name__ == "__main__":
    common.spawn(body, common.arguments(__doc__))
