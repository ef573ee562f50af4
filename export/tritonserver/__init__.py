"""Triton Inference Server model repositories, the one home of what ``vit-fast export tritonserver`` and
``vit-fast serve`` share. Imports point one way: config <- checks, specs <- layout <- entries, python_backend
<- sources. config.pbtxt's model (config), the serving-argument checks (checks), an artifact's tensors (specs),
the layout and its all-or-nothing writer (layout), the artifact entries (entries), the python-backend entry
(python_backend), and what a source makes, with :func:`to_tritonserver` (sources)."""

from __future__ import annotations

from .checks import (
    batch_plan,
    check_instances,
    check_model_name,
    check_queue_delay,
    machine_kind,
    model_name_for,
    parse_batch_sizes,
    plan_batching,
)
from .config import (
    DEFAULT_BATCH,
    DEFAULT_QUEUE_DELAY_US,
    ENGINE_SUFFIXES,
    INPUT_NAME,
    KINDS,
    MODEL_FILES,
    ONNX_SUFFIXES,
    PLATFORMS,
    TRITON_TYPES,
    VERSION,
    Batching,
    EntryConfig,
    TensorSpec,
    dtype_of,
    model_io,
    provenance_comments,
)
from .entries import onnx_entry, tensorrt_entry
from .layout import ModelEntry, check_repository, published_folder, repository_summary, write_repository
from .python_backend import DTYPE_PARAMETER, PYTHON_ENTRY_DTYPES, TEMPLATE, WEIGHTS, python_entry
from .sources import ENTRIES, entries_for, entry_names, to_tritonserver
from .specs import engine_specs, input_layout, onnx_specs

__all__ = [
    "Batching",
    "DEFAULT_BATCH",
    "DEFAULT_QUEUE_DELAY_US",
    "DTYPE_PARAMETER",
    "ENGINE_SUFFIXES",
    "ENTRIES",
    "EntryConfig",
    "INPUT_NAME",
    "KINDS",
    "MODEL_FILES",
    "ModelEntry",
    "ONNX_SUFFIXES",
    "PLATFORMS",
    "PYTHON_ENTRY_DTYPES",
    "TEMPLATE",
    "TRITON_TYPES",
    "TensorSpec",
    "VERSION",
    "WEIGHTS",
    "batch_plan",
    "check_instances",
    "check_model_name",
    "check_queue_delay",
    "check_repository",
    "dtype_of",
    "engine_specs",
    "entries_for",
    "entry_names",
    "input_layout",
    "machine_kind",
    "model_io",
    "model_name_for",
    "onnx_entry",
    "onnx_specs",
    "parse_batch_sizes",
    "plan_batching",
    "provenance_comments",
    "published_folder",
    "python_entry",
    "repository_summary",
    "tensorrt_entry",
    "to_tritonserver",
    "write_repository",
]
