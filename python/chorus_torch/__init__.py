"""chorus as a torch.distributed backend: `import chorus_torch` (or the chorus_torch.pth hook
that an install puts in site-packages, which imports it right after torch in every process)
registers backend "chorus"; then `torch.distributed.init_process_group("chorus", ...)`."""
import atexit
import os

import torch  # noqa: F401  (torch's types first: the backend derives from its c10d::Backend)
import torch.distributed as dist

from . import _build

__version__ = _build.CHORUS_VERSION

# The extension is bound to the torch it was compiled against (its C++ ABI, its pybind11 types):
# refuse any other before loading it, naming both, rather than fail on a missing symbol.
_here = (torch.__version__, torch.version.git_version)
if _here != (_build.TORCH_VERSION, _build.TORCH_GIT_VERSION):
    raise ImportError(
        f"chorus_torch {__version__} was built against torch {_build.TORCH_VERSION} "
        f"(git {_build.TORCH_GIT_VERSION[:12]}, {_build.TORCH_DIR}) but this Python loaded torch "
        f"{torch.__version__} (git {torch.version.git_version[:12]}, {os.path.dirname(torch.__file__)}): "
        "rebuild chorus_torch against the torch you run (pip install --no-build-isolation <chorus>)"
    )

from . import _C  # noqa: E402

# Note [Exiting Python] (src/work.cc): chorus's threads drop their references to Python's
# tensors before the interpreter finalizes.
atexit.register(_C._exiting)

# Note [Buckets in symmetric memory] (src/backend.h): torch's DDP takes its gradient buckets from
# the backend only when DDP_DISABLE_COMM_MEM is 0; set it before any DDP is built, unless the user
# chose.
os.environ.setdefault("DDP_DISABLE_COMM_MEM", "0")

if "CHORUS" not in dist.Backend._plugins:
    # devices=["cpu"]: chorus serves CPU tensors; "cpu:chorus,cuda:nccl" pairs it with another
    # backend for CUDA tensors.
    dist.Backend.register_backend("chorus", _C._create, extended_api=True, devices=["cpu"])


def engine(group=None):
    """The chorus engine that moves `group`'s data (default: the world): "shm" within one host,
    the hierarchy (shared memory inside each host, tcp between hosts) across several."""
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    return _C._engine(group._get_backend(torch.device("cpu")))


def make_default():
    """Makes chorus the backend torch picks for CPU tensors when a program names none:
    `init_process_group()` without a backend, and what reads torch's default map, such as
    Lightning Fabric's and the Trainer's strategy="ddp" on CPU. CHORUS_DEFAULT_CPU_BACKEND=1 does
    this at import, in every process that imports torch (the children of a launcher too)."""
    dist.Backend.default_device_backend_map["cpu"] = "chorus"


_default = os.environ.get("CHORUS_DEFAULT_CPU_BACKEND", "0")
if _default not in ("0", "1"):
    raise ImportError(f"CHORUS_DEFAULT_CPU_BACKEND must be 0 or 1, not {_default!r}")
if _default == "1":
    make_default()
