"""vit-fast's version, read once from the installed distribution's metadata (a base module: the
package facade, the environment collector and every report read it from this module)."""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("vit-fast")
except _metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
