"""PyTorch Lightning's distributed utilities on backend chorus, as Lightning 2.x ships them
(lightning.fabric.utilities.distributed, lightning.pytorch.overrides.distributed): the group
started by _init_dist_connection, uneven gathers, _sync_ddp's reductions (Lightning sends
ReduceOp.AVG to every backend not named gloo), the autograd all_gather against the gradient of
one process, and DDP's communication hooks fp16_compress_hook, powerSGD_hook and
post_localSGD_hook registered through Lightning's _register_ddp_comm_hook.

  PYTHONPATH=<build>/python/site .venv/bin/python python/tests/test_lightning_utils.py [-v]"""
import os
import unittest
import warnings

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.utilities.distributed import (
    _all_gather_ddp_if_available,
    _gather_all_tensors,
    _init_dist_connection,
    _sync_ddp,
    _sync_ddp_if_available,
)
from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook

from ranks import run_ranks

warnings.filterwarnings("ignore", message=".*deprecated.*")


def init_and_gather_uneven(rank, world):
    env = LightningEnvironment()
    env.set_global_rank(rank)
    env.set_world_size(world)
    _init_dist_connection(env, "chorus", init_method=os.environ["CHORUS_TEST_STORE"])
    assert dist.get_backend() == "chorus" and dist.get_world_size() == world

    # Lightning pads to the largest shape, gathers, and trims each back to its own shape.
    def made(r, shape_of):
        shape = shape_of(r)
        return float(r) + torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)

    for shape_of in (lambda r: (r + 1,), lambda r: (r + 1, 3), lambda r: (2, r + 2, 3 - r), lambda r: ()):
        got = _gather_all_tensors(made(rank, shape_of))
        assert len(got) == world and all(torch.equal(t, made(r, shape_of)) for r, t in enumerate(got)), got
    # A subgroup: only its members gather.
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    if rank % 2 == 0:
        got = _gather_all_tensors(torch.tensor([rank]), group=evens)
        assert [t.item() for t in got] == [r for r in range(world) if r % 2 == 0], got


def sync_reductions(rank, world):
    ranks = range(1, world + 1)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64):
        for op, want in (("sum", sum(ranks)), ("avg", sum(ranks) / world), ("mean", sum(ranks) / world),
                         ("max", world), ("min", 1), (dist.ReduceOp.SUM, sum(ranks)),
                         (dist.ReduceOp.AVG, sum(ranks) / world), (dist.ReduceOp.MAX, world)):
            t = torch.tensor([rank + 1, rank + 1], dtype=dtype)
            out = _sync_ddp(t, reduce_op=op)
            want_t = torch.tensor([want, want], dtype=torch.float64).to(dtype)  # integers truncate
            assert out is t and torch.equal(out, want_t), (dtype, op, out, want_t)
    t = torch.tensor([float(rank)])
    assert _sync_ddp_if_available(t, reduce_op="sum").item() == sum(range(world))


def autograd_all_gather(rank, world):
    """Rank r's loss is g_r(all ranks' x gathered); the one-process reference sums the g_r over r.
    Each rank's gradient of its own x must be the reference's gradient of that block."""
    torch.manual_seed(0)
    xs = [torch.randn(3, 2) for _ in range(world)]

    def g(r, stacked):
        return ((stacked ** 2) * (r + 1) + stacked.sin() * (r - 1)).sum()

    ref = [x.clone().requires_grad_() for x in xs]
    sum(g(r, torch.stack(ref)) for r in range(world)).backward()

    x = xs[rank].clone().requires_grad_()
    gathered = _all_gather_ddp_if_available(x, sync_grads=True)
    assert gathered.shape == (world, 3, 2)
    g(rank, gathered).backward()
    assert torch.allclose(x.grad, ref[rank].grad, atol=1e-6), (x.grad, ref[rank].grad)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def train(model, rank, steps, after_step=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if after_step:
            after_step(step)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gathered(flat):
    out = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(out, flat)
    return out


def comm_hooks(rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_localSGD
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

    plain = train(torch.nn.parallel.DistributedDataParallel(mlp()), rank, 4)

    # fp16_compress_hook: gradients travel as f16; the replicas stay equal, near plain DDP's.
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    _register_ddp_comm_hook(model, ddp_comm_hook=default_hooks.fp16_compress_hook)
    fp16 = train(model, rank, 4)
    assert all(torch.equal(p, fp16) for p in gathered(fp16)), "replicas differ under fp16_compress_hook"
    assert torch.allclose(fp16, plain, atol=1e-3), (fp16 - plain).abs().max()

    # powerSGD_hook, wrapped in fp16 compression as Lightning allows: 2 plain steps, then rank-1
    # approximations; the replicas stay equal.
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   min_compression_rate=0.5)
    _register_ddp_comm_hook(model, ddp_comm_state=state, ddp_comm_hook=powerSGD.powerSGD_hook,
                            ddp_comm_wrapper=default_hooks.fp16_compress_wrapper)
    compressed = train(model, rank, 5)
    assert state.iter == 5 and all(torch.equal(p, compressed) for p in gathered(compressed))

    # post_localSGD_hook: global averaging for 2 steps, then each subgroup of 2 ranks on its own,
    # with every rank's parameters averaged every 2 steps (Lightning's model averaging): after
    # steps 2 and 4, so after 5 steps every replica is the same again.
    subgroup, _ = dist.new_subgroups(group_size=2)
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    state = post_localSGD.PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=2)
    _register_ddp_comm_hook(model, ddp_comm_state=state, ddp_comm_hook=post_localSGD.post_localSGD_hook)
    averager = PeriodicModelAverager(period=2, warmup_steps=2)
    apart = []

    def average(step):
        if step == 3:  # a local step since the last average: the subgroups differ
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            apart.append(not all(torch.allclose(p, flat, atol=1e-6) for p in gathered(flat)))
        averager.average_parameters(model.parameters())

    local = train(model, rank, 5, after_step=average)
    assert apart == [True], "the subgroups never trained apart"
    everyone = gathered(local)
    assert all(torch.allclose(p, local, atol=1e-6) for p in everyone), "averaging left the replicas apart"
    assert not torch.allclose(local, plain, atol=1e-4), "local SGD never left global averaging"


class LightningUtilities(unittest.TestCase):
    def test_init_dist_connection_and_uneven_gathers(self):
        run_ranks(init_and_gather_uneven, world=3, backend=None)

    def test_sync_ddp_reductions(self):
        run_ranks(sync_reductions, world=3)

    def test_autograd_all_gather_matches_one_process(self):
        run_ranks(autograd_all_gather, world=3)

    def test_ddp_comm_hooks(self):
        run_ranks(comm_hooks, world=4)


if __name__ == "__main__":
    unittest.main()
