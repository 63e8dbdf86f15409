"""Backend "chorus" from Python, beyond torch's own suite: DDP with PowerSGD and with
find_unused_parameters, the error paths (dead peer, mismatch, timeout, a desynchronized DDP,
what chorus refuses), and the launchers (mp.spawn without an explicit import, torchrun,
chorusrun).
Every rank runs in its own process; a test fails instead of hanging.

  PYTHONPATH=<build>/python/site CHORUSRUN=<build>/launcher/chorusrun \\
    .venv/bin/python python/tests/test_backend.py [-v] [-k PATTERN]"""
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import torch
import torch.distributed as dist

import launch  # noqa: E402
from ranks import TIMEOUT, expect_error, run_ranks, shm_mapping  # noqa: E402


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def train_reference(steps, batches):
    """The same training in one process on the concatenated batches: what DDP must reproduce."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        x, y = batches(step, None)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def batches(step, rank, world=2):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(8 * world, 16, generator=g), torch.randn(8 * world, 4, generator=g)
    return (x, y) if rank is None else (x[8 * rank:8 * rank + 8], y[8 * rank:8 * rank + 8])


def train_matches_one_process(model, steps, rank, world, what=""):
    """Trains the DDP `model` on this rank's batches; it must end as train_reference does."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        x, y = batches(step, rank, world)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    want = train_reference(steps, lambda s, _: batches(s, None, world))
    for p, q in zip(model.module.parameters(), want.parameters()):
        assert torch.allclose(p, q, atol=1e-5), (what, (p - q).abs().max())


def ddp_matches_one_process(rank, world):
    train_matches_one_process(torch.nn.parallel.DistributedDataParallel(mlp()), 5, rank, world)


def ddp_buckets_in_symmetric_memory(rank, world):
    # Note [Buckets in symmetric memory]: chorus_torch turned torch's switch on, so the reducer's
    # buckets (built again after the first step) come from chorus's symmetric memory, whether the
    # gradients are views of them or copied in and out; with the switch off they do not.
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    assert os.environ.get("DDP_DISABLE_COMM_MEM") == "0", os.environ.get("DDP_DISABLE_COMM_MEM")
    for disable, as_view in (("0", False), ("0", True), ("1", False)):
        os.environ["DDP_DISABLE_COMM_MEM"] = disable
        model = torch.nn.parallel.DistributedDataParallel(mlp(), gradient_as_bucket_view=as_view)
        where = []

        def hook(state, bucket):
            where.append(shm_mapping(bucket.buffer().data_ptr()))
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, hook)
        train_matches_one_process(model, 3, rank, world, f"DDP_DISABLE_COMM_MEM={disable} view={as_view}")
        assert where, "the comm hook never ran"
        if disable == "0":
            assert all(where), f"gradient_as_bucket_view={as_view}: buckets outside symmetric memory: {where}"
        else:
            assert not any(where), f"DDP_DISABLE_COMM_MEM=1, yet buckets in chorus's shared memory: {where}"
    os.environ["DDP_DISABLE_COMM_MEM"] = "0"


class Unused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x, rank):
        # Ranks leave different parameters unused: find_unused_parameters must agree on them.
        return self.used(x) if rank == 0 else self.unused(self.used(x))


def ddp_find_unused(rank, world):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Unused(), find_unused_parameters=True)
    for step in range(3):
        model.zero_grad()
        model(torch.ones(2, 4) * (rank + 1), rank).sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    gathered = [torch.zeros_like(grads) for _ in range(world)]
    dist.all_gather(gathered, grads)
    assert all(torch.equal(g, gathered[0]) for g in gathered), "gradients differ across ranks"
    assert model.module.unused.weight.grad.abs().sum() > 0  # rank 1's gradient, averaged in


def ddp_powersgd(rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

    model = torch.nn.parallel.DistributedDataParallel(mlp())
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   min_compression_rate=0.5)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)  # collectives inside .then() callbacks
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(6):
        opt.zero_grad()
        x, y = batches(step, rank, world)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, gathered[0]) for g in gathered), "replicas differ under PowerSGD"


def dead_peer(rank, world):
    dist.barrier()
    if rank == 1:
        os._exit(7)  # dies without a word
    expect_error(lambda: [dist.all_reduce(torch.ones(4)) for _ in range(3)], "rank 1")


def mismatch(rank, world):
    msg = expect_error(lambda: dist.all_reduce(torch.ones(4 + rank)), "rank 0", "rank 1")
    assert "4" in msg and "5" in msg, msg


def timeout(rank, world):
    if rank == 0:
        expect_error(dist.barrier, "rank 1", "timed out")  # rank 1 never calls it
    else:
        time.sleep(6)  # alive, but elsewhere, past rank 0's 3 s deadline


def ddp_desync(rank, world):
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    steps = 3 if rank == 0 else 2  # rank 1 stops early and goes to a barrier: gloo hangs here
    def train():
        for step in range(steps):
            model(torch.randn(4, 16)).sum().backward()
        dist.barrier()
    expect_error(train, "rank")


def refused(rank, world):
    expect_error(lambda: dist.all_reduce(torch.ones(3).to_sparse()), "all_reduce", "Sparse", "to_dense")
    f8 = torch.zeros(4, dtype=torch.float8_e4m3fn)
    expect_error(lambda: dist.all_to_all_single(torch.empty_like(f8), f8), "all_to_all_single", "cannot be moved")
    # One rank's bad tensor is an error on every rank, naming that rank. (Tensors of other devices
    # reach chorus only where torch has a device with c10d kernels, CUDA or PrivateUse1, which this
    # CPU build has not: a meta tensor goes to torch's meta kernels, quantized ones are refused by
    # the dispatcher. ProcessGroupErrors in the C++ tests has the device case.)
    bad = f8 if rank == 1 else torch.ones(4)
    expect_error(lambda: dist.all_reduce(bad), "all_reduce", "rank 1", "Float8_e4m3fn")
    expect_error(lambda: dist.all_to_all_single(torch.zeros(3), torch.zeros(3)), "all_to_all_single", "rows")
    dist.barrier()  # the group is still usable after refusals


def uneven_all_to_all(rank, world):
    # rank p sends p + q + 1 rows to q, rows of 2 values p*100 + q
    send = [rank + q + 1 for q in range(world)]
    recv = [p + rank + 1 for p in range(world)]
    inp = torch.cat([torch.full((n, 2), float(rank * 100 + q)) for q, n in enumerate(send)])
    out = torch.empty(sum(recv), 2)
    dist.all_to_all_single(out, inp, recv, send)
    want = torch.cat([torch.full((n, 2), float(p * 100 + rank)) for p, n in enumerate(recv)])
    assert torch.equal(out, want), out
    outs = [torch.empty(n, 2, dtype=torch.int32) for n in recv]
    dist.all_to_all(outs, [t.to(torch.int32) for t in inp.split(send)])
    assert torch.equal(torch.cat(outs), want.to(torch.int32))


def large_all_gather(rank, world):
    # A list all_gather moves every rank's data straight into the caller's tensors, contiguous or not.
    t = torch.arange(300_000, dtype=torch.float32) + rank * 1e6
    outs = [torch.empty(300_000) if r % 2 == 0 else torch.empty(300_000, 2)[:, 1] for r in range(world)]
    dist.all_gather(outs, t)
    for r, o in enumerate(outs):
        assert torch.equal(o, torch.arange(300_000, dtype=torch.float32) + r * 1e6), r
    expect_error(lambda: dist.all_gather([torch.empty(5)] * world, t), "all_gather", "must hold 300000 elements")


def close_while_sending(rank, world):
    # Rank 0 drops its tensor and the group while its send is still in flight: the transfer's
    # thread then frees the last reference to a tensor Python made, which takes the GIL, while
    # the closing thread waits for it (Note [Closing under the GIL]).
    if rank == 0:
        t = torch.ones(16 << 20)
        dist.isend(t, 1)
        del t
    else:
        time.sleep(1)
        got = torch.zeros(16 << 20)
        dist.recv(got, 0)
        assert got.sum().item() == 16 << 20
    dist.destroy_process_group()


def subgroups(rank, world):
    evens = dist.new_group([0, 2])
    odd_one = dist.new_group([1])
    t = torch.tensor([float(rank)])
    if rank in (0, 2):
        dist.all_reduce(t, group=evens)
        assert t.item() == 2.0, t
        # Messages count ranks within the group, whose name says which ranks of the world it holds.
        expect_error(lambda: dist.all_reduce(torch.ones(1 + rank), group=evens), "world ranks [0, 2]",
                     "rank 0 (call #2): all_reduce(f32 x 1", "rank 1 (call #2): all_reduce(f32 x 3")
    elif rank == 1:
        dist.all_reduce(t, group=odd_one)
        assert t.item() == 1.0


class Backend(unittest.TestCase):
    def test_ddp_matches_one_process(self):
        run_ranks(ddp_matches_one_process, world=2)

    def test_ddp_buckets_in_symmetric_memory(self):
        run_ranks(ddp_buckets_in_symmetric_memory, world=2)

    def test_ddp_find_unused_parameters(self):
        run_ranks(ddp_find_unused, world=2)

    def test_ddp_powersgd_hook(self):
        run_ranks(ddp_powersgd, world=2)

    def test_dead_peer_is_named(self):
        run_ranks(dead_peer, world=2, expect_exit={1: 7})

    def test_mismatch_shows_each_ranks_call(self):
        run_ranks(mismatch, world=2)

    def test_timeout_names_the_missing_rank(self):
        run_ranks(timeout, world=2, timeout_s=3)

    def test_desynchronized_ddp_raises_instead_of_hanging(self):
        run_ranks(ddp_desync, world=2, timeout_s=10)

    def test_refused_calls_name_what_is_refused(self):
        run_ranks(refused, world=2)

    def test_uneven_all_to_all(self):
        run_ranks(uneven_all_to_all, world=3)

    def test_large_all_gather_into_strided_outputs(self):
        run_ranks(large_all_gather, world=3)

    def test_closing_a_group_while_a_send_is_in_flight(self):
        run_ranks(close_while_sending, world=2)

    def test_subgroups_name_their_members(self):
        run_ranks(subgroups, world=3)


class Import(unittest.TestCase):
    def test_another_torch_is_refused_by_name(self):
        # A torch of another version or build stands in for one chorus was not built against: the
        # import names both, before it loads the extension.
        import chorus_torch

        built = chorus_torch._build.TORCH_VERSION
        other = textwrap.dedent("""
            import torch
            torch.__version__ = "2.12.1+cpu"
            import chorus_torch
        """)
        env = dict(os.environ, CHORUS_TORCH_AUTOLOAD="0")
        out = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, env=env, timeout=TIMEOUT)
        self.assertNotEqual(out.returncode, 0, out.stdout)
        self.assertIn(f"built against torch {built}", out.stderr)
        self.assertIn("this Python loaded torch 2.12.1+cpu", out.stderr)
        # Another build of the same version (its git commit differs) is refused too.
        other = other.replace('torch.__version__ = "2.12.1+cpu"', 'torch.version.git_version = "0" * 40')
        out = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, env=env, timeout=TIMEOUT)
        self.assertIn("(git 000000000000,", out.stderr)

    def test_chorus_as_the_default_cpu_backend(self):
        # CHORUS_DEFAULT_CPU_BACKEND=1: init_process_group() naming no backend picks chorus for CPU.
        code = textwrap.dedent("""
            import sys, torch, torch.distributed as dist
            dist.init_process_group(init_method="file://" + sys.argv[1], rank=0, world_size=1)
            print("default", dist.get_backend_config())
        """)
        for value, want in (("1", "cpu:chorus"), ("0", "cpu:gloo")):
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, CHORUS_DEFAULT_CPU_BACKEND=value)
                out = subprocess.run([sys.executable, "-c", code, os.path.join(d, "store")], capture_output=True,
                                     text=True, env=env, timeout=TIMEOUT)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn(f"default {want}", out.stdout)
        env = dict(os.environ, CHORUS_DEFAULT_CPU_BACKEND="yes", CHORUS_TORCH_AUTOLOAD="0")
        out = subprocess.run([sys.executable, "-c", "import chorus_torch"], capture_output=True, text=True, env=env,
                             timeout=TIMEOUT)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("CHORUS_DEFAULT_CPU_BACKEND must be 0 or 1, not 'yes'", out.stderr)

    def test_hook_never_breaks_import_torch(self):
        # A chorus_torch that fails to import (here one that raises) leaves torch importable, with
        # a warning that says why chorus is not there.
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "chorus_torch"))
            with open(os.path.join(d, "chorus_torch", "__init__.py"), "w") as f:
                f.write("raise ImportError('built against another torch')\n")
            env = dict(os.environ, CHORUS_TORCH_AUTOLOAD="1")
            code = "import sys; sys.path.insert(0, sys.argv[1]); import torch; print('torch', torch.__version__)"
            out = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True, env=env,
                                 timeout=TIMEOUT)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("torch 2.", out.stdout)
        self.assertIn("chorus_torch was not loaded: built against another torch", out.stderr)


LAUNCHED = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    dist.init_process_group("chorus")  # env:// from the launcher; no import chorus_torch needed
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    w = dist.get_world_size()
    assert t.tolist() == [w * (w + 1) / 2] * 3, t
    # One write: print() writes its pieces one by one when stdout is unbuffered, and torchrun's
    # ranks share it.
    sys.stdout.write(f"rank {dist.get_rank()} of {dist.get_world_size()} backend {dist.get_backend()}\\n")
    sys.stdout.flush()
    dist.destroy_process_group()
""")

SPAWNED = textwrap.dedent("""
    import sys, tempfile, torch, torch.distributed as dist, torch.multiprocessing as mp

    def worker(rank, init):
        dist.init_process_group("chorus", init_method=init, rank=rank, world_size=2)
        t = torch.tensor([rank + 1.0]); dist.all_reduce(t); assert t.item() == 3.0
        print("spawned rank", rank, dist.get_backend(), flush=True)

    if __name__ == "__main__":
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(worker, args=(f"file://{d}/s",), nprocs=2)
""")


class Launchers(launch.InNamespace):
    """The launched programs meet on torch's TCPStore, which listens on every address: each runs
    in a network namespace of its own whose only interface is loopback."""

    tag = "py"

    def run_script(self, script, launcher):
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(script)
        try:
            out = self.netns.run(launcher + [f.name], timeout=TIMEOUT)
        finally:
            os.unlink(f.name)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out.stdout

    def test_mp_spawn_children_know_the_backend(self):
        # The children never run the parent's __main__ block: the autoload hook registers chorus.
        out = self.run_script(SPAWNED, [sys.executable])
        self.assertEqual(out.count("chorus"), 2, out)

    def test_torchrun(self):
        out = self.run_script(LAUNCHED, launch.torchrun(2))
        self.assertEqual(out.count("backend chorus"), 2, out)

    @unittest.skipUnless(os.environ.get("CHORUSRUN"), "CHORUSRUN names the chorusrun binary")
    def test_chorusrun(self):
        out = self.run_script(LAUNCHED, launch.chorusrun(3))
        self.assertEqual(out.count("backend chorus"), 3, out)


if __name__ == "__main__":
    unittest.main()
