"""timm where torchvision cannot be imported: the one place vit-fast imports timm.

:func:`import_timm` imports timm as it is where it can, else with a stand-in for ``torchvision`` that lives only
while timm imports, and says so once; :func:`install_standin` keeps the stand-in for a whole process (the tests).
Why and how: docs/development.md, "timm without torchvision"."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from typing import Any

#: the line printed once when the stand-in is installed for vit-fast's own import of timm
NOTE = (
    "note: torchvision cannot be imported here ({why}); vit-fast loads timm's model code with a torchvision "
    "stand-in (timm's transforms and datasets are unavailable; install the torchvision build that matches "
    "your torch for them)"
)


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:  # InterpolationMode.BICUBIC and the like, read at import time
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(qualname: str) -> type:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{qualname} is vit-fast's torchvision stand-in: torchvision cannot be imported here")

    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__init__": refuse, "__qualname__": qualname})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every ``torchvision`` / ``torchvision.*`` import with a stand-in module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package, so submodule imports come back here
        module.__version__ = "0.0.0+standin"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _drop(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


def standin_installed() -> bool:
    return any(isinstance(f, StandInFinder) for f in sys.meta_path)


def _torchvision_failure() -> str | None:
    """Why the real torchvision cannot be imported here (None: it imports)."""
    try:
        import torchvision  # noqa: F401
    except Exception as err:  # ImportError, or torchvision's RuntimeError when its ops do not match this torch
        _drop("torchvision")  # what the failed import left half-made
        return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
    return None


def install_standin() -> str | None:
    """Put the stand-in in place for the rest of the process unless the real torchvision imports (a test
    harness's form; :func:`import_timm` scopes it); returns why it could not (None: the real one imports,
    nothing installed)."""
    if standin_installed():
        return "stand-in already installed"
    why = _torchvision_failure()
    if why is not None:
        sys.meta_path.insert(0, StandInFinder())
    return why


@contextlib.contextmanager
def _standin_while() -> Iterator[None]:
    """The stand-in for the block only: afterwards no finder of ours is on ``sys.meta_path`` and no stand-in
    module in ``sys.modules`` (what imported them keeps its references)."""
    finder = StandInFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, _StandInModule)]:
            del sys.modules[name]


#: why timm was imported through the stand-in, while :data:`NOTE` has not been said yet
_NOTE_OWED: list[str] = []


def import_timm(note: bool = True) -> types.ModuleType:
    """``import timm``; where torchvision is what fails, again with the stand-in, and :data:`NOTE` on stderr once
    per process, on the first call with ``note`` (``note=False``: timm is only asked whether a name is one of its
    models, and the note waits for a use it concerns). An ImportError naming timm when timm itself is missing."""
    timm = _import_timm()
    if note and _NOTE_OWED:
        print(NOTE.format(why=_NOTE_OWED.pop()), file=sys.stderr)
    return timm


def _import_timm() -> types.ModuleType:
    if not standin_installed():
        try:
            import timm

            return timm
        except ModuleNotFoundError as err:
            if err.name == "timm":
                raise
        except Exception:  # torchvision's own failure, raised through timm's import
            pass
        _drop("timm")
        why = _torchvision_failure()
        if why is None:  # torchvision imports: timm failed for a reason of its own; let it say so
            import timm

            return timm
        try:
            with _standin_while():
                import timm
        except BaseException:
            _drop("timm")  # no half-imported timm bound to stand-ins that are gone
            raise
        _NOTE_OWED.append(why)
        return timm
    import timm

    return timm
