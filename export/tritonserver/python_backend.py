"""The python-backend entry (:func:`python_entry`): the vit-fast module itself rather than an artifact.
``REPO/NAME/1/model.py`` is :mod:`vit_fast.serve.triton_model`, ``REPO/NAME/1/model.safetensors`` the weights
with their config; config.pbtxt says ``backend: "python"`` and carries the served dtype as a parameter."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

import vit_fast
from vit_fast.backend.env import install_hint
from vit_fast.interop.checkpoints import save_checkpoint
from vit_fast.model.vit import VisionTransformer
from vit_fast.util.dtypes import dtype_name, parse_dtype
from vit_fast.util.files import copy_new, write_json_atomic

from .checks import check_model_name, plan_batching
from .config import DEFAULT_QUEUE_DELAY_US, MODEL_FILES, VERSION, EntryConfig, model_io, provenance_comments
from .layout import ModelEntry

#: the model.py copied into the entry: vit_fast.serve.triton_model, the code Triton's python backend runs. It is
#: read as a file, never imported (it imports triton_python_backend_utils, and the serve layer lies above this one)
TEMPLATE = Path(vit_fast.__file__).parent / "serve" / "triton_model.py"
#: names the template reads (its WEIGHTS and DTYPE_PARAMETER; a test keeps the two in step)
WEIGHTS = "model.safetensors"
DTYPE_PARAMETER = "vit_fast.dtype"
#: dtypes the python entry serves: numpy (the python backend's array type) has no bfloat16
PYTHON_ENTRY_DTYPES = (torch.float32, torch.float16)


def python_entry(
    model: VisionTransformer,
    name: str,
    batch: Sequence[int] | None = None,
    dtype: torch.dtype | str = torch.float32,
    instances: int = 1,
    kind: str = "gpu",
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    source_name: str | None = None,
) -> ModelEntry:
    """A ``backend: "python"`` entry serving ``model`` (triton kernels on KIND_GPU, torch on KIND_CPU). Inputs
    ``images [C, H, W]`` and outputs ``logits [num_classes]`` (``features [D]``) in ``dtype`` (fp32 or fp16);
    ``batch``, ``instances``, ``kind`` and ``queue_delay_us`` as for the artifact entries. The Python running
    Triton's python backend needs vit-fast installed."""
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"the python entry serves a vit_fast.VisionTransformer, got {type(model).__name__}")
    check_model_name(name)
    plan = plan_batching(batch, instances, kind, queue_delay_us)
    dtype = parse_dtype(dtype)
    if dtype not in PYTHON_ENTRY_DTYPES:
        raise ValueError(
            f"the python entry serves fp32 or fp16 (the python backend hands over numpy arrays, which have no "
            f"bfloat16), got {dtype_name(dtype)}"
        )

    def build(folder: Path) -> EntryConfig:
        version = folder / VERSION
        version.mkdir()
        copy_new(TEMPLATE, version / MODEL_FILES["python"])
        save_checkpoint(model, version / WEIGHTS)
        note = "no artifact: the entry serves the vit-fast module itself"
        write_json_atomic({"passed": None, "note": note}, folder / "verification.json")
        images, output = model_io(model, dtype)
        where = "triton kernels on KIND_GPU instances, the torch backend (eager PyTorch) on KIND_CPU"
        return EntryConfig(
            name=name,
            backend="python",
            inputs=[images],
            outputs=[output],
            batching=plan,
            parameters={DTYPE_PARAMETER: dtype_name(dtype)},
            comments=[
                *provenance_comments(
                    source_name or "a vit_fast.VisionTransformer",
                    "the module itself; check its triton backend with `vit-fast verify MODEL triton`",
                ),
                f"runs {where}; needs vit-fast installed in the Python of Triton's python backend: a wheel from "
                f"`make wheel`, or {install_hint()}",
            ],
        )

    return ModelEntry(name, build)
