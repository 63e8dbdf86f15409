"""Lightning Fabric on backend chorus, a user's program unchanged but for the backend string:

  python fabric_on_chorus.py ops --devices 2                 (Fabric launches the other ranks itself)
  torchrun --nproc-per-node 2 fabric_on_chorus.py ops --devices 2
  chorusrun --nproc-per-node 2 python fabric_on_chorus.py train --devices 2

  ops    every distributed operation of Fabric, each checked against the value it must give; each
         rank then prints its results as `result R: ...` lines, for comparing two backends.
  train  a short training; rank 0 prints `final loss L`. --kill-rank R --kill-step S: rank R
         kills itself (SIGKILL) in the middle of step S, after its forward pass.

--backend NAME (default chorus) goes to DDPStrategy(process_group_backend=NAME); --backend
default gives Fabric strategy="ddp" and lets torch pick the CPU backend (chorus when
CHORUS_DEFAULT_CPU_BACKEND=1). Every rank ends with `rank R of W on BACKEND`."""
import argparse
import os
import signal
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy

from goes_first import check_rank_zero_first

warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13's renamed collectives
warnings.filterwarnings("ignore", message=".*deprecated.*")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64]


def results(fabric, name, value):
    """One line per result, the same on every backend that gives the same answer."""
    sys.stdout.write(f"result {fabric.global_rank} {name}: {value!r}\n")
    sys.stdout.flush()


def ops(fabric, skip_dtypes):
    rank, world = fabric.global_rank, fabric.world_size
    fabric.barrier("before the checks")
    fabric.barrier()

    t = fabric.broadcast(torch.arange(3.0) + rank, src=world - 1)
    assert t.tolist() == [world - 1.0, world, world + 1.0], t
    results(fabric, "broadcast tensor", t.tolist())
    o = fabric.broadcast({"rank": rank, "list": [rank] * 2, "text": f"r{rank}"}, src=1)
    assert o == {"rank": 1, "list": [1, 1], "text": "r1"}, o
    results(fabric, "broadcast object", o)

    g = fabric.all_gather(torch.tensor([rank, -rank]))
    assert g.tolist() == [[r, -r] for r in range(world)], g
    nested = fabric.all_gather({"a": torch.ones(2) * rank, "b": [torch.tensor(rank), (torch.zeros(1, 2) + rank,)]})
    assert nested["a"].tolist() == [[r, r] for r in range(world)], nested
    assert nested["b"][0].tolist() == list(range(world)) and nested["b"][1][0].shape == (world, 1, 2), nested
    results(fabric, "all_gather nested", {"a": nested["a"].tolist(), "b0": nested["b"][0].tolist(),
                                          "b1": nested["b"][1][0].tolist()})
    # sync_grads=True: the gradient flows back to each rank's own input.
    x = torch.full((2,), float(rank + 1), requires_grad=True)
    gathered = fabric.all_gather(x, sync_grads=True)
    (gathered * torch.arange(1.0, world + 1).unsqueeze(1)).sum().backward()
    # The gathered sum is the same on every rank, so each rank's x gets world * (rank + 1).
    assert x.grad.tolist() == [float(world * (rank + 1))] * 2, x.grad
    results(fabric, "all_gather sync_grads", x.grad.tolist())

    for dtype in [d for d in DTYPES if str(d).split(".")[1] not in skip_dtypes]:
        for op in ("sum", "mean", "max"):
            v = torch.tensor([rank + 1, 2 * rank + 3, 7], dtype=dtype)
            r = fabric.all_reduce(v, reduce_op=op)
            ranks = range(1, world + 1)
            if op == "sum":
                want = [sum(ranks), sum(2 * k + 1 for k in ranks), 7 * world]
            elif op == "max":
                want = [world, 2 * world + 1, 7]
            else:
                want = [sum(ranks) / world, sum(2 * k + 1 for k in ranks) / world, 7]
            want = torch.tensor(want, dtype=torch.float64).to(dtype)  # integers truncate, as torch's do
            assert r.dtype == dtype and torch.allclose(r.double(), want.double(), rtol=1e-2), (dtype, op, r, want)
            results(fabric, f"all_reduce {op} {dtype}", r.tolist())

    # rank_zero_first: rank 0's body has finished before the others start theirs; local=True
    # the same per node. Fabric waits on a gloo group of its own beside the backend's.
    where = fabric.broadcast(tempfile.mkdtemp() if rank == 0 else None, src=0)
    for local in (False, True):
        check_rank_zero_first(fabric.rank_zero_first(local=local), rank, os.path.join(where, f"rank0-done-{local}"),
                              f"rank_zero_first(local={local})")
    fabric.barrier()

    # setup, setup_dataloaders, no_backward_sync: gradients stay local, then the mean.
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.arange(12.0).unsqueeze(1), batch_size=2))
    seen = fabric.all_gather(torch.cat([b for b in loader]).flatten()).flatten().sort().values
    assert seen.tolist() == list(range(12)), seen  # a distributed sampler: each sample on one rank
    inp = torch.ones(1, 3) * (rank + 1)
    with fabric.no_backward_sync(model):
        fabric.backward(model(inp).sum())
    assert model.weight.grad.tolist() == [[rank + 1.0] * 3], model.weight.grad
    optimizer.zero_grad()
    fabric.backward(model(inp).sum())
    assert torch.allclose(model.weight.grad, torch.full((1, 3), (world + 1) / 2)), model.weight.grad
    optimizer.step()
    results(fabric, "weight after a synced step", model.weight.tolist())

    # save and load: rank 0 writes, every rank reads the same state back.
    path = os.path.join(where, "checkpoint.ckpt")
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": 7})
    fresh = torch.nn.Linear(3, 1, bias=False)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1)
    fresh, fresh_opt = fabric.setup(fresh, fresh_opt)
    state = {"model": fresh, "optimizer": fresh_opt}
    rest = fabric.load(path, state)
    assert rest == {"step": 7} and torch.equal(fresh.weight, model.weight), (rest, fresh.weight, model.weight)
    fabric.barrier()
    if rank == 0:
        import shutil

        shutil.rmtree(where)
    print(f"rank {rank}: Fabric's operations gave what they must", flush=True)


def train(fabric, args):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :1] * 2 - x[:, 1:2]).tanh()
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                                                  batch_size=16, shuffle=False))
    step = 0
    for epoch in range(3):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            if step == args.kill_step and fabric.global_rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)  # mid-step: forward done, gradients never sent
            fabric.backward(loss)
            optimizer.step()
            step += 1
    total = fabric.all_reduce(loss.detach(), reduce_op="mean")
    if fabric.global_rank == 0:
        print(f"final loss {total.item():.6f} after {step} steps", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["ops", "train"])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--backend", default="chorus")
    ap.add_argument("--skip-dtypes", default="", help="all_reduce leaves these out (gloo: int16)")
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    strategy = "ddp" if args.backend == "default" else DDPStrategy(process_group_backend=args.backend)
    fabric = Fabric(accelerator="cpu", devices=args.devices, strategy=strategy)
    fabric.launch()
    assert fabric.world_size == args.devices > 1, fabric.world_size
    ops(fabric, args.skip_dtypes.split(",")) if args.what == "ops" else train(fabric, args)
    sys.stdout.write(f"rank {fabric.global_rank} of {fabric.world_size} on {dist.get_backend()}\n")
    sys.stdout.flush()
    if dist.get_backend() == "gloo":
        # torch 2.13's gloo aborts now and then as Python exits ("terminate called without an
        # active exception", also with chorus not loaded; accelerate_on_chorus.py); the results are in.
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
