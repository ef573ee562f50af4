"""The python-backend entry written by `vit-fast export tritonserver --entries python` served by
Triton's own tritonserver binary (2.51, bundled by PyTriton): the generated config.pbtxt and model.py
load in a real server and answer HTTP and gRPC. (That binary has the python backend only: ONNX and
TensorRT entries need the onnxruntime / tensorrt backends of NVIDIA's tritonserver image.)"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from ._support import NEEDS_SERVE, port_is_free, start_tritonserver

pytest.importorskip("pytriton", reason=NEEDS_SERVE)
http = pytest.importorskip("tritonclient.http", reason=NEEDS_SERVE)
grpc = pytest.importorskip("tritonclient.grpc", reason=NEEDS_SERVE)

import vit_fast  # noqa: E402
from vit_fast.cli import tritonserver as cli  # noqa: E402
from vit_fast.util.numerics import assert_within_eager  # noqa: E402


def test_python_entry_loads_and_answers_in_tritonserver(tmp_path) -> None:
    repo = tmp_path / "repo"
    parser = argparse.ArgumentParser(prog="vit-fast export tritonserver")
    cli.add_arguments(parser)
    argv = ["default", "--out", str(repo), "--entries", "python", "--kind", "cpu", "--batch", "1,4,16", "--quiet"]
    assert cli.run(parser.parse_args(argv)) == 0
    server = start_tritonserver(tmp_path, repo, ["default_python"])
    model = vit_fast.load_model("default", backend="torch")
    rng = np.random.default_rng(0)
    try:
        for module, url in ((http, server.http), (grpc, server.grpc)):
            client = module.InferenceServerClient(url)
            try:
                kwargs = {} if module is http else {"as_json": True}
                config = client.get_model_config("default_python", **kwargs)
                assert int(config.get("config", config)["max_batch_size"]) == 16
                for batch in (1, 5, 16):
                    x = rng.standard_normal((batch, 1, 32, 32)).astype(np.float32)
                    inp = module.InferInput("images", list(x.shape), "FP32")
                    inp.set_data_from_numpy(x)
                    y = torch.from_numpy(np.array(client.infer("default_python", [inp]).as_numpy("logits")))
                    with torch.no_grad():
                        eager = model(torch.from_numpy(x))
                        ref = model.double()(torch.from_numpy(x).double())
                        model.float()
                    assert_within_eager(y, eager, ref, f"python entry, batch {batch}")
                bad = module.InferInput("images", [2, 1, 16, 16], "FP32")
                bad.set_data_from_numpy(np.zeros((2, 1, 16, 16), np.float32))
                with pytest.raises(Exception, match="shape"):
                    client.infer("default_python", [bad])
            finally:
                client.close()
    finally:
        rc = server.terminate()
    assert rc == 0, server.output()[-3000:]
    assert all(port_is_free(p) for p in server.ports)
