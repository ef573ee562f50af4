"""Export to ONNX and TensorRT, installed as ``vit_fast.export``; every artifact can be verified before
it is published.

``to_onnx`` writes an ONNX file (plus metadata JSON beside it; outputs, I/O names and an opt-in uint8
preprocessing front selectable), ``to_tensorrt`` builds a TensorRT engine from the ONNX file,
``open_artifact`` gives the one runner for an artifact (runners.py) and ``verify`` runs it and judges
every output against eager PyTorch. With ``verify=`` the exporters verify the staged artifact and
publish it (with its metadata and report) only when it passed; the metadata then records how
(``format_verification`` shows that record). onnx, onnxruntime and tensorrt are imported only when
those functions run.

Imports inside the package point one way: _common <- graph <- trt_common <- runners <- verify_checks,
verify_report <- verify <- onnx_checks <- onnx, tensorrt; _common <- triton_config <- tritonserver.
"""

from __future__ import annotations

from ._common import (
    ArtifactError,
    ExportError,
    check_artifact_outputs,
    check_report_path,
    is_vit_fast_artifact,
    plain_model,
    read_metadata,
    weights_record,
)
from .graph import LAYOUTS, OUTPUTS
from .onnx import FusedAttention, onnx_op_counts, to_onnx
from .runners import open_artifact
from .tensorrt import to_tensorrt
from .verify import VerificationError, VerifyOptions, VerifyReport, VerifyRow, format_verification, verify

__all__ = [
    "LAYOUTS",
    "OUTPUTS",
    "ArtifactError",
    "ExportError",
    "FusedAttention",
    "VerificationError",
    "VerifyOptions",
    "VerifyReport",
    "VerifyRow",
    "check_artifact_outputs",
    "check_report_path",
    "format_verification",
    "is_vit_fast_artifact",
    "onnx_op_counts",
    "open_artifact",
    "plain_model",
    "read_metadata",
    "to_onnx",
    "to_tensorrt",
    "verify",
    "weights_record",
]
