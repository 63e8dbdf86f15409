"""Loads chorus_torch as soon as `import torch` has finished, so backend "chorus" is known in
every Python process, including the children of torch.multiprocessing.spawn that never run the
parent's `if __name__ == "__main__":` block. Installed with chorus_torch.pth, which site.py runs
at start-up; it imports nothing until torch itself is imported. CHORUS_TORCH_AUTOLOAD=0 turns
it off (then `import chorus_torch` registers the backend)."""
import importlib.abc
import importlib.util
import os
import sys


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once; the lookup below uses the other finders
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_torch = spec.loader.exec_module

        def exec_module(module):
            exec_torch(module)
            try:
                import chorus_torch  # noqa: F401  registers "chorus"
            except Exception as e:  # torch must still import; say why chorus is not there
                import warnings

                warnings.warn(f"chorus_torch was not loaded: {e}", RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_module
        return spec


def install():
    if os.environ.get("CHORUS_TORCH_AUTOLOAD", "1") == "0" or "torch" in sys.modules:
        return
    if not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())
