"""TensorRT helpers shared by the engine builder (``tensorrt.py``) and the engine runner (``runners.py``): importing
tensorrt and polygraphy with a clear error, their logging and errors in our terms, the GPU's compute capability,
engine tensor types as torch dtypes, and the two checks before an engine runs (built for this TensorRT and GPU; the
batch inside its profile). Imports neither tensorrt nor polygraphy until a function that needs them is called."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from vit_fast.backend.env import install_hint
from vit_fast.util.dtypes import TRT_TYPES

from ._common import ArtifactError

#: ``trt.DataType`` member names of the engine I/O tensors vit-fast runs -> torch dtype (floating types only)
TORCH_DTYPES: dict[str, torch.dtype] = {name: dt for name, dt in TRT_TYPES.items() if dt.is_floating_point}


def require_tensorrt() -> Any:
    """``import tensorrt``, or a RuntimeError that says it is missing and what it needs."""
    try:
        import tensorrt as trt
    except ImportError as err:
        raise RuntimeError(
            f"TensorRT is not installed here (import tensorrt failed: {err}); it needs an NVIDIA GPU and the "
            f"tensorrt extra (TensorRT 10 and polygraphy): {install_hint('tensorrt')}"
        ) from err
    if int(trt.__version__.split(".")[0]) < 10:
        raise RuntimeError(f"vit-fast needs TensorRT >= 10, found {trt.__version__}")
    return trt


def require_polygraphy() -> Any:
    """``polygraphy.backend.trt`` (the loaders and ``TrtRunner``), or a RuntimeError that says how to install it."""
    try:
        from polygraphy.backend import trt as pg
    except ImportError as err:
        raise RuntimeError(
            f"polygraphy is not installed here (import polygraphy failed: {err}); vit-fast builds and runs TensorRT "
            f"engines through it: {install_hint('tensorrt')} (or pip install polygraphy)"
        ) from err
    return pg


@contextlib.contextmanager
def polygraphy_logging(error: type[Exception], message: str) -> Iterator[None]:
    """Polygraphy's logger at WARNING (TensorRT's own messages go through it) and without colours for the block;
    a PolygraphyException (raised after polygraphy logged the reason) becomes ``error(f"{message}: {reason}")``."""
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    colors, G_LOGGER.colors = G_LOGGER.colors, False  # with colours it first asks for the `colored` package
    try:
        with G_LOGGER.verbosity(G_LOGGER.WARNING):
            yield
    except PolygraphyException as err:
        raise error(f"{message}: {err}") from err
    finally:
        G_LOGGER.colors = colors


def gpu_sm() -> str:
    """The current GPU's compute capability as ``"sm_90"``; ``"none"`` without a GPU."""
    if not torch.cuda.is_available():
        return "none"
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def trt_dtype_name(dtype: Any) -> str:
    """The member name of a ``trt.DataType`` (``"FLOAT"``, ``"HALF"``, ``"BF16"``, ...).

    pybind11 enums have ``.name``; ``str()`` of one is ``"DataType.HALF"``, used as a fallback.
    """
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rsplit(".", 1)[-1]


def torch_dtype(dtype: Any, tensor: str, engine_path: str | os.PathLike, is_input: bool = False) -> torch.dtype:
    """The torch dtype for an engine I/O tensor's ``trt.DataType``; an ArtifactError for others. An input may
    also be UINT8 (images for an engine built from an ONNX file with a preprocessing front)."""
    name = trt_dtype_name(dtype)
    allowed = {**TORCH_DTYPES, "UINT8": torch.uint8} if is_input else TORCH_DTYPES
    if name not in allowed:
        raise ArtifactError(
            f"engine {str(engine_path)!r}: tensor {tensor!r} has TensorRT type {name}; vit-fast runs engines whose "
            f"inputs and outputs are {', '.join(TORCH_DTYPES)} (inputs also UINT8)"
        )
    return allowed[name]


def check_engine_compat(meta: dict[str, Any], engine_path: str | os.PathLike, trt_version: str, sm: str) -> None:
    """Raise an ArtifactError saying what to rebuild when ``meta`` is for another TensorRT or GPU."""
    built_trt, built_sm = meta.get("tensorrt_version"), meta.get("gpu_sm")
    onnx_src = meta.get("onnx", "the ONNX file")
    rebuild = f"rebuild it here: vit-fast export tensorrt {onnx_src} --out {engine_path}"
    if built_trt and built_trt != trt_version:
        raise ArtifactError(
            f"engine {str(engine_path)!r} was built with TensorRT {built_trt}, this machine has TensorRT "
            f"{trt_version}; engines do not load across versions: {rebuild}"
        )
    if built_sm and built_sm != sm:
        raise ArtifactError(
            f"engine {str(engine_path)!r} was built for GPU {built_sm} ({meta.get('gpu_name', '?')}), this GPU is "
            f"{sm}; engines are specific to the compute capability: {rebuild}"
        )


def check_batch_in_profile(batch: int, profile: tuple[int, int, int], engine_path: str | os.PathLike) -> None:
    """Raise an ArtifactError when ``batch`` lies outside the engine's optimization profile ``(min, opt, max)``."""
    lo, opt, hi = profile
    if not lo <= batch <= hi:
        raise ArtifactError(
            f"batch {batch} is outside engine {str(engine_path)!r}'s profile (min {lo}, opt {opt}, max {hi}): "
            f"rebuild with --batch {min(lo, batch)} {opt} {max(hi, batch)} (to_tensorrt(batch=...)) to cover it"
        )
