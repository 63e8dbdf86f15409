"""scikit-build-core metadata provider (pyproject.toml): the wheel requires exactly the torch it was
built against, the one installed in the building environment (pip install --no-build-isolation).
chorus_torch's extension is bound to that torch's C++ ABI, and an open range would let pip fetch
the newest torch, a CUDA build of several GB."""


def dynamic_metadata(field, settings=None, project=None):
    if field != "dependencies":
        raise RuntimeError(f"chorus_torch_requirement provides 'dependencies', not {field!r}")
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(
            "chorus_torch builds against the torch of the environment it installs into: install torch first, "
            "then pip install --no-build-isolation <chorus> (an isolated build environment has no torch)"
        ) from e
    return [f"torch=={torch.__version__.split('+')[0]}"]
