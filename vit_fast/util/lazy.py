"""A package whose names load on first use (PEP 562): its light submodules (the settings a command line builds
its parser from) import without the heavy ones (torch) that the rest of the package needs."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, Iterable[str]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package`` (call it from the package's ``__init__``):
    ``names`` maps each submodule to the public names it defines, each imported from there on first use; any
    other name that is a submodule is that submodule, imported then."""
    namespace = vars(sys.modules[package])
    homes = {name: module for module, defined in names.items() for name in defined}

    def __getattr__(name: str) -> Any:
        if name in homes:
            value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
            namespace[name] = value  # looked up once
            return value
        if not name.startswith("__"):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as err:
                if err.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return sorted(homes), __getattr__, __dir__
