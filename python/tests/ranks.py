"""Runs a function in several fresh processes, each a rank of a torch.distributed group on backend
"chorus", and reports every failing rank's traceback; a test fails instead of hanging. Shared by
the Python tests (test_backend.py, test_collectives.py)."""
import multiprocessing
import os
import sys
import tempfile
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = 120  # seconds for any one test's processes
if "CHORUS" not in dist.Backend._plugins:
    sys.exit("backend chorus is not registered: run with PYTHONPATH=<build>/python/site "
             "(or with chorus_torch installed), which loads chorus_torch after torch in every process")


def _child(fn, rank, world, init, timeout_s, errors, backend):
    torch.set_num_threads(1)
    try:
        if backend is None:  # fn starts the group itself, from this store
            os.environ.update(CHORUS_TEST_STORE=init, RANK=str(rank), WORLD_SIZE=str(world))
        else:
            dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=timeout_s))
        fn(rank, world)
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        errors.close()
        errors.join_thread()  # the report is written before the process ends
        os._exit(1)
    os._exit(0)  # no teardown: a test may leave its group broken on purpose


def run_ranks(fn, world=2, timeout_s=60, expect_exit=None, backend="chorus", start="fork"):
    """Runs fn(rank, world) in `world` fresh processes after init_process_group(backend).
    Returns nothing; raises with every failing rank's traceback. expect_exit: {rank: code} for
    ranks that leave on purpose. backend=None: fn starts the group itself, from the file store
    named by $CHORUS_TEST_STORE. Forked by default (a spawned rank imports torch again, seconds)."""
    ctx = multiprocessing.get_context(start)
    errors = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_child, args=(fn, r, world, f"file://{d}/store", timeout_s, errors, backend))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(TIMEOUT)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    reports = []
    while not errors.empty():
        reports.append("rank %d:\n%s" % errors.get())
    if hung:
        raise AssertionError(f"ranks {hung} hung for {TIMEOUT} s\n" + "\n".join(reports))
    want = expect_exit or {}
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != want.get(r, 0)]
    if bad:
        raise AssertionError(f"exit codes (rank, code) {bad}\n" + "\n".join(reports))


def expect_error(fn, *needles):
    """fn() must raise RuntimeError whose message holds every needle; returns the message."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        assert not missing, f"{missing} not in: {msg}"
        return msg
    raise AssertionError(f"no error; expected one naming {needles}")


def shm_mapping(address):
    """The /dev/shm/chorus-* mapping (a chorus shared-memory object) that holds `address`, or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5] if len(parts) > 5 and parts[5].startswith("/dev/shm/chorus-") else None
    return None
