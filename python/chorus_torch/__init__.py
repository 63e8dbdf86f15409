"""chorus as a torch.distributed backend: `import chorus_torch`, then
`torch.distributed.init_process_group("chorus", ...)`."""
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
    dist.Backend.register_backend("chorus", _C._create)
