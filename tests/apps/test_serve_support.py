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
from vit_fast.serve import backend as srv_backend
from vit_fast.serve import server as srv
from vit_fast.serve.loadtest import percentile

SERVE_EXTRA_HERE = importlib.util.find_spec("pytriton") is not None and int(np.__version__.split(".")[0]) < 2


@pytest.mark.skipif(SERVE_EXTRA_HERE, reason="the serve extra is installed here, so nothing is missing")
def test_serve_without_the_extra_says_how_to_install_it() -> None:
    with pytest.raises(ImportError, match=r"pip install -e '\.\[serve\]' in a vit-fast checkout"):
        srv.require_serve()
    from vit_fast.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[serve\]'"):
        serve.run(parser.parse_args(["default"]))


def _libdir(monkeypatch, folder) -> None:
    real = srv_backend.sysconfig.get_config_var
    monkeypatch.setattr(
        srv_backend.sysconfig, "get_config_var", lambda name: str(folder) if name == "LIBDIR" else real(name)
    )


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


def test_queue_delay_defaults_to_zero_on_the_cpu_and_the_export_default_on_cuda(monkeypatch) -> None:
    """On the CPU one instance batches what queues during a forward, so the batcher does not wait; on CUDA it
    waits the export default; an explicit value is kept either way."""
    from vit_fast.export.tritonserver import DEFAULT_QUEUE_DELAY_US
    from vit_fast.serve.settings import CPU_QUEUE_DELAY_US

    model = vit_fast.load_model("default", backend="torch")
    assert CPU_QUEUE_DELAY_US == 0 and srv.Server(model).batching.queue_delay_us == 0
    assert srv.Server(model, queue_delay_us=250).batching.queue_delay_us == 250
    monkeypatch.setattr(srv.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(srv.copy, "deepcopy", lambda m: m)  # no card to move the weights to
    monkeypatch.setattr(type(model), "to", lambda self, *a, **k: self)
    assert srv.Server(model).batching.queue_delay_us == DEFAULT_QUEUE_DELAY_US > 0


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
    monkeypatch.setattr(srv.Server, "check_ports", lambda self: None)
    monkeypatch.setattr(srv.Server, "_wait_ready", lambda self: None)
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


def _serve_cli_with_fake_triton(
    monkeypatch, tmp_path, *argv: str, real_port_check: bool = False, model: str = "default"
) -> tuple[int, list[tuple]]:
    """``vit-fast serve ARGV --json ready.json`` with Triton replaced by a stand-in; returns the exit status and
    the events in order: the port checks, each model warm-up (batch sizes, tune), Triton's start, the model's
    readiness probe (with the torch threads the forwards run with), the ready JSON written."""
    import torch

    from vit_fast.cli import serve
    from vit_fast.model.vit import VisionTransformer

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

    real_check = srv.Server.check_ports

    def check_ports(server):
        events.append(("ports checked",))
        if real_port_check:
            real_check(server)

    def wait_ready(server):
        events.append(("model ready probed", ready.exists(), torch.get_num_threads()))

    monkeypatch.setattr(srv, "require_serve", lambda: None)
    if real_port_check:  # port locks of this test's own: the real folder is shared by every serve of this user
        from vit_fast.serve import ports

        monkeypatch.setattr(ports, "LOCK_ROOT", tmp_path)
    monkeypatch.setattr(VisionTransformer, "warmup", warmup)
    monkeypatch.setattr(srv.Server, "_start_once", start_once)
    monkeypatch.setattr(srv.Server, "wait", wait)
    monkeypatch.setattr(srv.Server, "check_ports", check_ports)
    monkeypatch.setattr(srv.Server, "_wait_ready", wait_ready)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args([model, *argv, "--json", str(ready)])
    return serve.run(args), events


@pytest.mark.parametrize(("flag", "tune"), [((), False), (("--tune",), True)])
def test_serve_warms_every_served_batch_size_before_it_reports_ready(monkeypatch, tmp_path, capsys, flag, tune):
    import torch

    before = torch.get_num_threads()
    status, events = _serve_cli_with_fake_triton(monkeypatch, tmp_path, "--batch", "8,2,32", "--threads", "1", *flag)
    assert status == 0
    # ports first (before any long work); one warm-up of 1 (a lone request), the preferred sizes and the largest;
    # then Triton; then the model's own readiness, with --threads in force; only then the ready JSON
    assert events == [
        ("ports checked",),
        ("ports checked",),
        ("warmup", [1, 2, 8, 32], tune),
        ("triton started", False),
        ("model ready probed", False, 1),
        ("ready json", True),
    ]
    assert torch.get_num_threads() == before  # stop() gave torch its threads back
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

    from ..fakes import record_triton_forwards, tiny_model

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

    from vit_fast.model.vit import VisionTransformer

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


def test_a_busy_port_is_named_before_any_long_work(monkeypatch, tmp_path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=rf"gRPC port {port} on 127.0.0.1 is already in use.*--grpc-port"):
            _serve_cli_with_fake_triton(monkeypatch, tmp_path, "--grpc-port", str(port), real_port_check=True)
    assert not (tmp_path / "ready.json").exists()


@pytest.mark.parametrize("before", [0o600, 0o644])
def test_the_ready_json_is_readable_by_its_user_only(monkeypatch, tmp_path, before) -> None:
    """It may carry the access token: 0600 whatever an earlier run's file there allowed (it used to become 0644,
    widening a 0600 file)."""
    import json
    import os
    import stat

    from vit_fast.util.files import MARKER_KEY, json_text

    ready = tmp_path / "ready.json"
    ready.write_text(json_text({MARKER_KEY: "0"}))  # an earlier run's, sealed as vit-fast writes it
    ready.chmod(before)
    status, _ = _serve_cli_with_fake_triton(monkeypatch, tmp_path, "--threads", "1", "--protect", "on")
    assert status == 0
    assert json.loads(ready.read_text())["protected"] is True  # this run's, not the earlier one
    assert stat.S_IMODE(os.stat(ready).st_mode) == 0o600


def test_threads_default_fits_the_instances_and_the_cores(monkeypatch) -> None:
    from vit_fast.backend import runtime

    assert runtime.intra_op_threads(1, cores=2) == 1  # one core left for Triton's own processes
    assert runtime.intra_op_threads(2, cores=16) == 7
    assert runtime.intra_op_threads(4, cores=2) == 1  # never 0
    assert runtime.intra_op_threads(1, reserve=0, cores=8) == 8
    with pytest.raises(ValueError, match="workers must be >= 1"):
        runtime.intra_op_threads(0)
    model = vit_fast.load_model("default", backend="torch")
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 16)
    assert srv.Server(model, instances=3).threads == 5
    assert srv.Server(model, instances=3, threads=2).threads == 2
    assert "2 torch thread(s) each" in srv.Server(model, threads=2).description
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads must be an int >= 1"):
            srv.Server(model, threads=bad)


@pytest.mark.parametrize(
    ("host", "protect", "protected"),
    [
        ("127.0.0.1", "auto", False),
        ("127.0.0.2", "auto", False),
        ("localhost", "auto", False),
        ("::1", "auto", False),
        ("0.0.0.0", "auto", True),
        ("10.1.2.3", "auto", True),
        ("127.0.0.1", "on", True),
        ("0.0.0.0", "off", False),
    ],
)
def test_statistics_are_open_on_loopback_and_protected_elsewhere(host, protect, protected) -> None:
    model = vit_fast.load_model("default", backend="torch")
    s = srv.Server(model, host=host, protect=protect)
    assert s.protected is protected
    assert s.access_token is None  # no token before the server started


def test_protect_takes_auto_on_or_off_only() -> None:
    model = vit_fast.load_model("default", backend="torch")
    with pytest.raises(ValueError, match="protect must be one of"):
        srv.Server(model, protect="yes")


def _plain_state_dict(tmp_path):
    """The default model's weights as a plain state dict (no vit-fast metadata) and its config.json beside it."""
    import json

    from safetensors.torch import save_file

    model = vit_fast.load_model("default", backend="torch")
    weights, config = tmp_path / "w.safetensors", tmp_path / "config.json"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    config.write_text(json.dumps(model.cfg.to_dict()))
    return weights, config


def test_serve_and_export_tritonserver_take_config_like_every_other_command(monkeypatch, tmp_path) -> None:
    from vit_fast.cli import tritonserver

    weights, config = _plain_state_dict(tmp_path)
    status, events = _serve_cli_with_fake_triton(monkeypatch, tmp_path, "--config", str(config), model=str(weights))
    assert status == 0 and ("ready json", True) in events
    parser = argparse.ArgumentParser()
    tritonserver.add_arguments(parser)
    repo = tmp_path / "repo"
    argv = [str(weights), "--config", str(config), "--out", str(repo), "--entries", "python", "--quiet"]
    assert tritonserver.run(parser.parse_args(argv)) == 0
    assert (repo / "w_python" / "config.pbtxt").is_file()
    with pytest.raises(ValueError, match="carries no vit-fast config.*--config"):
        tritonserver.run(parser.parse_args([str(weights), "--out", str(tmp_path / "r2"), "--entries", "python"]))
    onnx = tmp_path / "m.onnx"
    with pytest.raises(ValueError, match="--config describes a model SOURCE"):
        tritonserver.run(parser.parse_args([str(onnx), "--config", str(config), "--out", str(tmp_path / "r3")]))


def test_cpu_serving_without_batch_sizes_sends_all_that_is_queued(monkeypatch) -> None:
    """On the CPU, no preferred batch size unless asked for: the batcher then sends every queued request in one
    forward (with 8 preferred it sent 8 images per forward with 64 waiting); explicit sizes and CUDA keep theirs."""
    from vit_fast.serve.settings import CPU_PREFERRED_BATCH

    model = vit_fast.load_model("default", backend="torch")
    s = srv.Server(model)
    assert CPU_PREFERRED_BATCH == () and (s.batching.max_batch_size, s.batching.preferred_batch_sizes) == (64, ())
    assert "max batch 64, no preferred size" in s.description
    assert srv.Server(model, batch=[1, 8, 64]).batching.preferred_batch_sizes == (8, 64)
    assert srv.Server(model, batch=[16]).batching.preferred_batch_sizes == (16,)
    monkeypatch.setattr(srv.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(srv.copy, "deepcopy", lambda m: m)  # no card to move the weights to
    monkeypatch.setattr(type(model), "to", lambda self, *a, **k: self)
    assert srv.Server(model).batching.preferred_batch_sizes == (8, 64)


def test_requests_travel_as_base64_for_small_images_and_through_shared_memory_above(monkeypatch) -> None:
    from vit_fast.serve.settings import BASE64_MAX_IMAGE_BYTES

    monkeypatch.delenv(srv.NO_TENSORSTORE, raising=False)
    assert srv.proxy_transport(1) == srv.proxy_transport(BASE64_MAX_IMAGE_BYTES) == "base64"
    assert srv.proxy_transport(BASE64_MAX_IMAGE_BYTES + 1) == "tensor store"
    assert srv.proxy_transport(3 * 224 * 224 * 4, {srv.NO_TENSORSTORE: "1"}) == "base64"  # the user's switch holds
    assert srv.proxy_transport(3 * 224 * 224 * 4, {srv.NO_TENSORSTORE: ""}) == "tensor store"
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="image_bytes must be an int >= 1"):
            srv.proxy_transport(bad)
    small = vit_fast.load_model("default", backend="torch")  # 1x32x32 fp32: 4 KiB
    cfg = vit_fast.ViTConfig(**{**small.cfg.to_dict(), "img_size": 64, "in_chans": 3})  # 48 KiB
    large = vit_fast.VisionTransformer(cfg, backend="torch")
    assert srv.Server(small).transport == "base64"
    assert "requests handed over as base64" in srv.Server(small).description
    assert srv.Server(large).transport == "tensor store"
    assert srv.Server(large, dtype="fp16").transport == "tensor store"  # 24 KiB
    monkeypatch.setenv(srv.NO_TENSORSTORE, "1")
    assert srv.Server(large).transport == "base64"


def test_openmp_spinning_is_bounded_before_torch_loads_and_a_users_setting_is_kept(monkeypatch) -> None:
    from vit_fast.serve.settings import OPENMP_SPIN_COUNT, limit_openmp_spin

    monkeypatch.delitem(sys.modules, "torch")  # as in `vit-fast serve` before it imports torch
    env: dict[str, str] = {}
    assert limit_openmp_spin(env) is True and env == {"GOMP_SPINCOUNT": str(OPENMP_SPIN_COUNT)}
    for own in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "active"}):
        env = dict(own)
        assert limit_openmp_spin(env) is True and env == own
    monkeypatch.undo()  # torch loaded: too late to set, and said so
    env = {}
    assert "torch" in sys.modules and limit_openmp_spin(env) is False and env == {}


def _gomp_spincount_at_torch_import(code: str) -> str:
    """Run ``code`` in a child without GOMP_SPINCOUNT / OMP_WAIT_POLICY; it stops where torch is first imported
    and this returns what GOMP_SPINCOUNT was then (libgomp reads it once, when torch loads it)."""
    import os
    import subprocess

    probe = (
        "import builtins, os, sys\n"
        "real = builtins.__import__\n"
        "def watch(name, *a, **k):\n"
        "    if name.split('.')[0] == 'torch' and 'torch' not in sys.modules:\n"
        "        print('at torch import:', os.environ.get('GOMP_SPINCOUNT'), flush=True); os._exit(0)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = watch\n"
    ) + code
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("at torch import: "), out.stdout + out.stderr
    return out.stdout.strip().removeprefix("at torch import: ")


@pytest.mark.parametrize(
    "code",
    [
        "from vit_fast.cli import main\nsys.exit(main(['serve', 'default']))\n",  # vit-fast serve
        # the python-backend model of `vit-fast export tritonserver`, as a stub process loads it
        "import types\nsys.modules['triton_python_backend_utils'] = types.ModuleType('triton_python_backend_utils')\n"
        "import vit_fast.serve.triton_model\n",
    ],
    ids=["serve", "python-backend-model"],
)
def test_openmp_spinning_is_bounded_before_torch_is_imported(code) -> None:
    from vit_fast.serve.settings import OPENMP_SPIN_COUNT

    assert _gomp_spincount_at_torch_import(code) == str(OPENMP_SPIN_COUNT)
    # a control: without vit-fast's call first, torch loads with the variable unset
    assert _gomp_spincount_at_torch_import("import torch\n") == "None"


@pytest.mark.parametrize(
    ("env", "threads", "warned"), [({}, 2, True), ({}, 1, False), ({"GOMP_SPINCOUNT": "1"}, 2, False)]
)
def test_a_server_started_with_torchs_openmp_spinning_says_so(monkeypatch, capsys, env, threads, warned) -> None:
    for var in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(srv.Server, "_start_once", lambda self: self)
    monkeypatch.setattr(srv.Server, "check_ports", lambda self: None)
    monkeypatch.setattr(srv.Server, "_wait_ready", lambda self: None)
    s = srv.Server(vit_fast.load_model("default", backend="torch"), threads=threads)
    try:
        s.start()
    finally:
        s.stop()
    assert ("GOMP_SPINCOUNT=10000 before Python imports torch" in capsys.readouterr().err) is warned
