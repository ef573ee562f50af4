"""Triton python-backend model serving a vit-fast module (copied as ``1/model.py`` by ``vit-fast export tritonserver``;
the weights lie beside it as ``1/model.safetensors``): :class:`TritonPythonModel`.

It runs only inside Triton's python backend, with vit-fast installed in that Python; a KIND_GPU instance runs our
kernels, a KIND_CPU one the torch backend, each dynamic batch as one forward. More: docs/deploy.md."""

from __future__ import annotations

import json
from pathlib import Path

from vit_fast.serve.settings import limit_openmp_spin

# before torch loads OpenMP in this stub process: its threads then stop spinning soon after each op instead of
# holding cores Triton needs (vit_fast.serve.settings.OPENMP_SPIN_COUNT; a GOMP_SPINCOUNT or OMP_WAIT_POLICY set in
# the server's environment is kept)
limit_openmp_spin()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from vit_fast import load_checkpoint  # noqa: E402
from vit_fast.util.dtypes import parse_dtype  # noqa: E402

WEIGHTS = "model.safetensors"
DTYPE_PARAMETER = "vit_fast.dtype"


def served_batch_sizes(config: dict) -> list[int]:
    """1, the dynamic batcher's preferred sizes and ``max_batch_size``, from the model config as JSON."""
    preferred = config.get("dynamic_batching", {}).get("preferred_batch_size", [])
    return sorted({1, *map(int, preferred), max(1, int(config.get("max_batch_size", 1)))})


class TritonPythonModel:
    """The python backend's model interface: ``initialize`` once per instance, ``execute`` per batch of requests."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.dtype = parse_dtype(params.get(DTYPE_PARAMETER, "fp32"))
        if args["model_instance_kind"] == "GPU":
            self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        else:
            self.device = torch.device("cpu")
        # model_repository is this model's folder; the weights sit in its version folder
        weights = Path(args["model_repository"]) / args["model_version"] / WEIGHTS
        self.model = load_checkpoint(weights, backend="auto").to(self.device, self.dtype).eval()
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        # compile the kernels for the batch sizes the dynamic batcher prefers before this instance takes requests
        # (each instance is a process of its own; tuning only with VIT_FAST_AUTOTUNE=1 in the server's environment)
        self.model.warmup(served_batch_sizes(config))

    def execute(self, requests: list) -> list:
        arrays = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        x = torch.from_numpy(np.concatenate(arrays)).to(self.device, self.dtype)
        with torch.inference_mode():
            y = self.model(x).cpu().numpy()
        responses, start = [], 0
        for a in arrays:
            rows = np.ascontiguousarray(y[start : start + a.shape[0]])
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output_name, rows)]))
            start += a.shape[0]
        return responses
