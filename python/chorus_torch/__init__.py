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

# Note [Exiting Python] (src/backend.cc): chorus's threads drop their references to Python's
# tensors before the interpreter finalizes.
atexit.register(_C._exiting)

if "CHORUS" not in dist.Backend._plugins:
    # devices=["cpu"]: chorus serves CPU tensors; "cpu:chorus,cuda:nccl" pairs it with another
    # backend for CUDA tensors.
    dist.Backend.register_backend("chorus", _C._create, extended_api=True, devices=["cpu"])


def engine(group=None):
    """The chorus engine that moves `group`'s data (default: the world): "shm" within one host,
    the hierarchy (shared memory inside each host, gloo between hosts) across several."""
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    return _C._engine(group._get_backend(torch.device("cpu")))
