"""torch 2.x's calls on backend "chorus", beyond distributed_test.py: the coalesced tensor forms
that functional collectives, DTensor and FSDP2 call even for one tensor, coalescing blocks
(_coalescing_manager, batch_isend_irecv), AVG on every dtype, recv from any rank, subgroups made
by new_subgroups and split_group, the object collectives, a backend string per device, and the
errors of these calls: a coalesced call whose lists differ between ranks, a peer that dies inside
a coalescing block.

  PYTHONPATH=<build>/python/site .venv/bin/python python/tests/test_collectives.py [-v] [-k PATTERN]"""
import os
import unittest
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ranks import expect_error, run_ranks


def coalesced_tensor_forms(rank, world):
    # What FSDP2 and DTensor reach: all_gather_into_tensor_coalesced and
    # reduce_scatter_tensor_coalesced (through functional collectives, also for one tensor).
    x = torch.arange(6, dtype=torch.float32) + 10 * rank
    gathered = funcol.all_gather_tensor(x, 0, group=dist.group.WORLD)
    want = torch.cat([torch.arange(6, dtype=torch.float32) + 10 * r for r in range(world)])
    assert torch.equal(gathered, want), gathered
    y = torch.arange(4 * world, dtype=torch.float32) * (rank + 1)
    part = funcol.reduce_scatter_tensor(y, "sum", 0, group=dist.group.WORLD)
    total = sum(range(1, world + 1))
    assert torch.equal(part, torch.arange(4 * rank, 4 * rank + 4, dtype=torch.float32) * total), part
    z = funcol.all_reduce(torch.ones(3) * rank, "avg", group=dist.group.WORLD)
    assert torch.allclose(z, torch.full((3,), (world - 1) / 2)), z
    # The coalescing manager with several tensors: one coalesced call each.
    ins = [torch.ones(2) * rank, torch.arange(3, dtype=torch.float64) + rank]
    outs = [torch.empty(2 * world), torch.empty(3 * world, dtype=torch.float64)]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    assert torch.equal(outs[0], torch.cat([torch.ones(2) * r for r in range(world)])), outs[0]
    assert torch.equal(outs[1], torch.cat([torch.arange(3, dtype=torch.float64) + r for r in range(world)]))
    rs_in = [torch.ones(2 * world) * (rank + 1), torch.ones(world, dtype=torch.int64)]
    rs_out = [torch.empty(2), torch.empty(1, dtype=torch.int64)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    assert torch.equal(rs_out[0], torch.full((2,), float(total))) and rs_out[1].item() == world
    ts = [torch.ones(3) * rank, torch.ones(2, dtype=torch.int32) * rank]
    with dist._coalescing_manager(group=dist.group.WORLD, device=torch.device("cpu")):  # start/endCoalescing
        for t in ts:
            dist.all_reduce(t)
    assert torch.equal(ts[0], torch.full((3,), float(world * (world - 1) // 2)))
    assert torch.equal(ts[1], torch.full((2,), world * (world - 1) // 2, dtype=torch.int32))


def batch_send_recv(rank, world):
    # batch_isend_irecv takes the coalescing path (supports_coalescing): a ring in both directions.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    a, b = torch.zeros(5), torch.zeros(5)
    ops = [dist.P2POp(dist.isend, torch.full((5,), float(rank)), nxt),
           dist.P2POp(dist.irecv, a, prv),
           dist.P2POp(dist.isend, torch.full((5,), float(rank) + 0.5), prv),
           dist.P2POp(dist.irecv, b, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(a, torch.full((5,), float(prv))) and torch.equal(b, torch.full((5,), nxt + 0.5)), (a, b)


def averages(rank, world):
    # AVG on every dtype: floating ones average (f16/bf16 in f32), integers truncate as torch's
    # backends do.
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        t = torch.full((4,), float(rank + 1), dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        assert torch.allclose(t.float(), torch.full((4,), (world + 1) / 2)), (dtype, t)
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        t = torch.full((3,), 2 * rank + 1, dtype=dtype)  # sum = world^2
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        assert torch.equal(t, torch.full((3,), world * world // world, dtype=dtype)), (dtype, t)
        u = torch.full((3,), rank, dtype=dtype)  # sum = world (world - 1) / 2, truncated mean
        dist.all_reduce(u, op=dist.ReduceOp.AVG)
        assert torch.equal(u, torch.full((3,), (world - 1) // 2, dtype=dtype)), (dtype, u)
    out = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, torch.full((2 * world,), rank, dtype=torch.int64), op=dist.ReduceOp.AVG)
    assert torch.equal(out, torch.full((2,), (world - 1) // 2)), out
    out = torch.empty(2, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(out, torch.full((2 * world,), rank + 1, dtype=torch.bfloat16), op=dist.ReduceOp.AVG)
    assert torch.allclose(out.float(), torch.full((2,), (world + 1) / 2)), out
    # PREMUL_SUM: the sum of every rank's tensor times the factor.
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    assert torch.allclose(t, torch.full((3,), 0.5 * world * (world + 1) / 2)), t


def recv_any_source(rank, world):
    if rank == 0:
        seen = set()
        for _ in range(world - 1):
            t = torch.zeros(2)
            src = dist.recv(t)  # src=None: whichever rank's message comes first
            assert torch.equal(t, torch.full((2,), float(src))), (src, t)
            seen.add(src)
        assert seen == set(range(1, world)), seen
        # Rank 1 sends again only after this barrier: before it, its second
        # message could come first and be taken in place of rank 2's.
        dist.barrier()
        t = torch.zeros(2)
        work = dist.irecv(t)
        work.wait()
        assert work._source_rank() == 1 and torch.equal(t, torch.ones(2)), (work._source_rank(), t)
    else:
        dist.send(torch.full((2,), float(rank)), 0)
        dist.barrier()
        if rank == 1:
            dist.send(torch.ones(2), 0)
    dist.barrier()


def subgroups(rank, world):
    mine, groups = dist.new_subgroups(group_size=2)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    first = rank - rank % 2
    assert t.item() == first + first + 1, t
    # split_group's C++ half (torch's Python refuses it without an accelerator): ProcessGroup::
    # split_group splits each device's backend, chorus's too.
    world_pg = dist.distributed_c10d._get_default_group()
    half = [r for r in range(world) if r % 2 == rank % 2]
    split = world_pg.split_group(half, timeout=timedelta(seconds=30), group_name=f"split_{rank % 2}")
    assert split is not None and split.size() == len(half), split
    u = torch.tensor([float(rank)])
    split.allreduce([u]).wait()
    assert u.item() == sum(half), (u, half)


def objects(rank, world):
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(world)], objs
    lst = [{"a": 1}, [2, 3], "four"] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [{"a": 1}, [2, 3], "four"], lst
    out = [None] * world if rank == world - 1 else None
    dist.gather_object(("from", rank), out, dst=world - 1)
    if rank == world - 1:
        assert out == [("from", r) for r in range(world)], out
    got = [None]
    dist.scatter_object_list(got, [f"to {r}" for r in range(world)] if rank == 0 else None, src=0)
    assert got == [f"to {rank}"], got


def per_device_string(rank, world):
    # "cpu:chorus,cuda:gloo": chorus serves CPU tensors in a group whose CUDA tensors another
    # backend would serve (this CPU build has no NCCL; gloo stands in for it).
    assert dist.get_backend() == "cpu:chorus,cuda:gloo", dist.get_backend()
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    assert backend.name() == "chorus", backend.name()
    t = torch.ones(2) * rank
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(sum(range(world))))), t


def coalesced_mismatch(rank, world):
    # The same element count, split differently: an error on every rank showing each rank's list.
    ins = [torch.ones(2), torch.ones(4)] if rank == 0 else [torch.ones(4), torch.ones(2)]
    outs = [torch.empty(world * i.numel()) for i in ins]

    def call():
        with dist._coalescing_manager():
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)

    expect_error(call, "every rank must pass the same list", "rank 0: all_gather_into_coalesced(Float[2], Float[4])",
                 "rank 1: all_gather_into_coalesced(Float[4], Float[2])")


def dead_in_block(rank, world):
    dist.barrier()
    if rank == 1:
        os._exit(9)  # dies inside the block, before its calls
    ts = [torch.ones(3), torch.ones(2)]

    def block():
        with dist._coalescing_manager(group=dist.group.WORLD, device=torch.device("cpu"), async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()

    expect_error(block, "rank 1")


class Collectives(unittest.TestCase):
    def test_coalesced_tensor_forms(self):
        for world in (1, 2, 3):
            run_ranks(coalesced_tensor_forms, world=world)

    def test_batch_isend_irecv(self):
        run_ranks(batch_send_recv, world=3)

    def test_avg_on_every_dtype(self):
        for world in (2, 3):
            run_ranks(averages, world=world)

    def test_recv_from_any_source(self):
        run_ranks(recv_any_source, world=3)

    def test_new_subgroups_and_split_group(self):
        run_ranks(subgroups, world=4)

    def test_object_collectives(self):
        run_ranks(objects, world=3)

    def test_a_backend_per_device(self):
        run_ranks(per_device_string, world=2, backend="cpu:chorus,cuda:gloo")


class Errors(unittest.TestCase):
    def test_coalesced_lists_that_differ(self):
        run_ranks(coalesced_mismatch, world=2)

    def test_dead_peer_inside_a_coalescing_block(self):
        run_ranks(dead_in_block, world=2, expect_exit={1: 9})


if __name__ == "__main__":
    unittest.main()
