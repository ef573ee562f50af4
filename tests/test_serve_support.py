"""The parts of vit-fast serve that need no server: the serve extra's error message, the python-backend
stub's LD_LIBRARY_PATH, percentiles, and the server's argument checks. Serving itself: tests/serve."""

from __future__ import annotations

import argparse
import importlib.util
import sys

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
