"""The parts of vit-fast serve that need no server: the serve extra's error message, the python-backend
stub's LD_LIBRARY_PATH, percentiles, and the server's argument checks. Serving itself: tests/serve."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import threading

import numpy as np
import pytest

import vit_fast
from vit_fast.serve import server as srv
from vit_fast.serve.loadtest import percentile

SERVE_EXTRA_HERE = importlib.util.find_spec("pytriton") is not None and int(np.__version__.split(".")[0]) < 2


@pytest.mark.skipif(SERVE_EXTRA_HERE, reason="the serve extra is installed here, so nothing is missing")
def test_serve_without_the_extra_says_how_to_install_it() -> None:
    with pytest.raises(ImportError, match=r"pip install 'vit-fast\[serve\]'"):
        srv.require_serve()
    from vit_fast.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    with pytest.raises(ImportError, match=r"vit-fast\[serve\]"):
        serve.run(parser.parse_args(["default"]))


def _libdir(monkeypatch, folder) -> None:
    real = srv.sysconfig.get_config_var
    monkeypatch.setattr(srv.sysconfig, "get_config_var", lambda name: str(folder) if name == "LIBDIR" else real(name))


def test_python_backend_env_puts_this_interpreters_libpython_first(monkeypatch, tmp_path) -> None:
    soname = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    (tmp_path / soname).write_bytes(b"")
    _libdir(monkeypatch, tmp_path)
    env = srv.python_backend_env({"LD_LIBRARY_PATH": f"/opt/a:{tmp_path}:/opt/b", "OTHER": "kept"})
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path}:/opt/a:/opt/b"
    assert env["OTHER"] == "kept"
    assert srv.python_backend_env({})["LD_LIBRARY_PATH"] == str(tmp_path)


def test_python_backend_env_leaves_a_static_python_alone(monkeypatch, tmp_path) -> None:
    _libdir(monkeypatch, tmp_path)  # no shared libpython there
    assert srv.python_backend_env({"LD_LIBRARY_PATH": "/opt/a"}) == {"LD_LIBRARY_PATH": "/opt/a"}


def test_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(batch=[0, 8]), "batch sizes"),
        (dict(instances=0), "instances"),
        (dict(http_port=70000), "http port"),
        (dict(http_port=9000, grpc_port=9000), "different ports"),
        (dict(dtype="bf16"), "fp32 or fp16"),
        (dict(name="a/b"), "not usable by Triton"),
        (dict(queue_delay_us=-5), "queue delay"),
    ],
)
def test_server_checks_its_arguments_before_starting(kwargs, match) -> None:
    model = vit_fast.load_model("default", backend="torch")
    with pytest.raises(ValueError, match=match):
        srv.Server(model, **kwargs)


def test_server_describes_what_it_serves() -> None:
    model = vit_fast.load_model("default", backend="torch")
    s = srv.Server(model, name="default", batch=[1, 8, 32])
    assert (s.batching.max_batch_size, s.batching.preferred_batch_sizes) == (32, (8, 32))
    assert (s.input.name, s.input.dims, s.output.name, s.output.dims) == ("images", (1, 32, 32), "logits", (10,))
    assert s.endpoints.health_url == "http://127.0.0.1:8000/v2/health/ready"
    assert srv.Endpoints("0.0.0.0", 1, 2, 3).grpc == "127.0.0.1:2"  # every interface is reached on loopback
    assert model.cfg.num_classes == 10 and "max batch 32" in s.description


def test_start_retries_pytriton_instance_race_only(monkeypatch, capsys) -> None:
    model = vit_fast.load_model("default", backend="torch")
    race = RuntimeError(f"load failed: ConnectionRefusedError in {srv.HANDSHAKE_RACE}")
    outcomes: list = []

    def fake_start(self):
        result = outcomes.pop(0)
        if isinstance(result, Exception):
            raise result
        return self

    monkeypatch.setattr(srv.Server, "_start_once", fake_start)
    s = srv.Server(model, instances=2)
    outcomes[:] = [race, s]
    assert s.start() is s and outcomes == []
    assert "raced at start-up" in capsys.readouterr().err
    outcomes[:] = [race] * srv.START_ATTEMPTS + [s]
    with pytest.raises(RuntimeError, match=srv.HANDSHAKE_RACE):
        s.start()
    assert outcomes == [s]  # gave up after START_ATTEMPTS
    outcomes[:] = [ValueError("port in use"), s]
    with pytest.raises(ValueError, match="port in use"):
        s.start()  # any other failure is not retried


def _serve_cli_with_fake_triton(monkeypatch, tmp_path, *argv: str) -> tuple[int, list[tuple]]:
    """``vit-fast serve ARGV --json ready.json`` with Triton replaced by a stand-in; returns the exit status and
    the events in order: each model warm-up (batch sizes, tune), Triton's start, the ready JSON written."""
    from vit_fast.cli import serve
    from vit_fast.model import VisionTransformer

    events: list[tuple] = []
    ready = tmp_path / "ready.json"
    real_warmup = VisionTransformer.warmup

    def warmup(model, batch_sizes, dtype=None, tune=False, verbose=True):
        events.append(("warmup", list(batch_sizes), tune))
        return real_warmup(model, batch_sizes, dtype=dtype, tune=tune, verbose=verbose)

    def start_once(server):
        events.append(("triton started", ready.exists()))
        return server

    def wait(server, poll_s=1.0):
        events.append(("ready json", ready.exists()))
        return True  # as if asked to stop

    monkeypatch.setattr(srv, "require_serve", lambda: None)
    monkeypatch.setattr(VisionTransformer, "warmup", warmup)
    monkeypatch.setattr(srv.Server, "_start_once", start_once)
    monkeypatch.setattr(srv.Server, "wait", wait)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(["default", *argv, "--json", str(ready)])
    return serve.run(args), events


@pytest.mark.parametrize(("flag", "tune"), [((), False), (("--tune",), True)])
def test_serve_warms_every_served_batch_size_before_it_reports_ready(monkeypatch, tmp_path, capsys, flag, tune):
    status, events = _serve_cli_with_fake_triton(monkeypatch, tmp_path, "--batch", "8,2,32", *flag)
    assert status == 0
    # one warm-up of 1 (a lone request), the preferred sizes and the largest; then Triton; then the ready JSON
    assert events == [("warmup", [1, 2, 8, 32], tune), ("triton started", False), ("ready json", True)]
    err = capsys.readouterr().err
    assert "nothing to compile: the model runs on the torch backend here (cpu input)" in err  # this CPU machine


def test_serve_tune_flag_parses_and_reaches_the_server() -> None:
    from vit_fast.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert parser.parse_args(["default"]).tune is False
    assert parser.parse_args(["default", "--tune"]).tune is True
    model = vit_fast.load_model("default", backend="torch")
    assert srv.Server(model, batch=[1, 4, 16], tune=True).served_batch_sizes == [1, 4, 16]
    assert srv.Server(model, batch=[16]).served_batch_sizes == [1, 16]
    with pytest.raises(TypeError, match="tune must be True or False"):
        srv.Server(model, tune="yes")


def test_serve_warmup_on_the_triton_backend_marks_the_shared_model_tuned(monkeypatch) -> None:
    """Instance threads call the one served model; ``--tune`` marks that model, so their forwards (each thread
    with its own tuning context) run tuned as the warm-up did."""

    from .util import record_triton_forwards, tiny_model

    seen = record_triton_forwards(monkeypatch)
    server = srv.Server(tiny_model(), batch=[1, 4], tune=True)
    server.model.set_backend("triton")  # what "auto" picks on a GPU
    report = server.warmup()
    assert report.tuned and seen == [(1, True), (4, True)] and server.model.autotune
    images = np.zeros((2, 3, 32, 32), dtype=np.float32)
    thread = threading.Thread(target=server.infer, args=(images,))  # an instance thread: a fresh context
    thread.start()
    thread.join()
    assert seen[-1] == (2, True)


def test_python_backend_entry_warms_its_served_batch_sizes(monkeypatch, tmp_path) -> None:
    """The python-backend model of `vit-fast export tritonserver` warms 1, the preferred sizes and the largest in
    ``initialize`` (before Triton marks the instance ready). Triton's utils module exists only inside Triton:
    a stand-in lets the entry import here."""
    import json
    import types

    from vit_fast.model import VisionTransformer

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    monkeypatch.delitem(sys.modules, "vit_fast.serve.triton_model", raising=False)
    from vit_fast.serve import triton_model

    warmed: list[list[int]] = []
    monkeypatch.setattr(VisionTransformer, "warmup", lambda model, sizes, **kw: warmed.append(list(sizes)))
    (tmp_path / "1").mkdir()
    vit_fast.save_checkpoint(vit_fast.load_model("default", backend="torch"), tmp_path / "1" / "model.safetensors")
    config = {
        "max_batch_size": 16,
        "dynamic_batching": {"preferred_batch_size": [4, 16]},
        "input": [{"name": "images"}],
        "output": [{"name": "logits"}],
        "parameters": {},
    }
    args = {"model_config": json.dumps(config), "model_instance_kind": "CPU", "model_repository": str(tmp_path)}
    triton_model.TritonPythonModel().initialize({**args, "model_version": "1", "model_instance_device_id": "0"})
    assert warmed == [[1, 4, 16]]
    assert triton_model.served_batch_sizes({"max_batch_size": 8}) == [1, 8]
    assert triton_model.served_batch_sizes({}) == [1]
