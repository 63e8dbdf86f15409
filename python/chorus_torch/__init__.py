"""chorus as a torch.distributed backend: `import chorus_torch`, then
`torch.distributed.init_process_group("chorus", ...)`."""
import inspect
import os

import torch  # noqa: F401  (torch's types first: the backend returns its ProcessGroup)
import torch.distributed as dist

from . import _C

if os.path.realpath(_C._built_libtorch) != _C._loaded_libtorch():
    raise ImportError(
        f"chorus_torch was built against {_C._built_libtorch} but this Python loaded "
        f"{_C._loaded_libtorch()}: rebuild chorus against the torch you run"
    )

if "CHORUS" not in dist.Backend._plugins:
    # torch 2.x asks which devices a backend serves; 1.13 has no such argument.
    devices = {"devices": ["cpu"]} if "devices" in inspect.signature(dist.Backend.register_backend).parameters else {}
    dist.Backend.register_backend("chorus", _C._create, extended_api=True, **devices)


def engine(group=None):
    """The chorus engine that moves `group`'s data (default: the world): "shm" within one host,
    the hierarchy (shared memory inside each host, gloo between hosts) across several."""
    return _C._engine(group if group is not None else dist.distributed_c10d._get_default_group())
