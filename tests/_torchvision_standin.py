"""An import-time stand-in for ``torchvision``, so that timm's model code imports on CPU machines.

torchvision has no CPU build for the torch these machines use (its wheel links CUDA torch), and
timm imports it at module level for a few names only (``FrozenBatchNorm2d``, transforms, datasets)
that ViT model code never calls. ``install()`` puts a finder on ``sys.meta_path`` that answers every
``torchvision.*`` import with a module whose attributes are placeholders: importing works, using one
raises a RuntimeError that says it is a stand-in. It is installed only where the real torchvision
cannot be imported (the GPU machine has the real one), and only by the test session.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str):  # InterpolationMode.BICUBIC and the like, read at import time
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(qualname: str) -> type:
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{qualname} is the tests' torchvision stand-in: the real torchvision is not installed")

    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__init__": refuse, "__qualname__": qualname})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package, so submodule imports come back here
        module.__version__ = "0.0.0+standin"
        return module

    def exec_module(self, module):
        pass


def install() -> bool:
    """Install the stand-in unless a real torchvision imports; True when the stand-in is in use."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _Finder())
        return True
    return False
