"""`vit-fast serve MODEL --load-test` in this process: start, load-test on loopback, report, stop."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ._support import NEEDS_SERVE, free_ports, port_is_free

pytest.importorskip("pytriton", reason=NEEDS_SERVE)

from vit_fast.cli import serve  # noqa: E402


def test_cli_load_test_writes_its_report_and_stops(tmp_path, capsys) -> None:
    ports = free_ports(3)
    out = tmp_path / "load.json"
    parser = argparse.ArgumentParser(prog="vit-fast serve")
    serve.add_arguments(parser)
    args = parser.parse_args(
        ["default", "--load-test", "--clients", "2", "--requests", "10", "--batch", "1,4", "--json", str(out)]
        + ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    )
    assert serve.run(args) == 0
    report = json.loads(out.read_text())
    assert report["passed"] and report["answered"] == report["requests"] == 20
    assert report["batch_sizes"] == [1, 2, 3, 4]  # mixed sizes up to --batch's maximum
    printed = capsys.readouterr().out
    assert "p50" in printed and "PASSED" in printed
    assert all(port_is_free(p) for p in ports)


def test_json_dash_puts_the_ready_summary_alone_on_stdout(tmp_path) -> None:
    """`vit-fast serve default --json -`, as a script reads it: one JSON document on stdout once the model answers
    (Triton's own output, started from this command, goes to stderr with the rest), then a clean stop."""
    import signal
    import subprocess
    import sys
    import urllib.request

    ports = free_ports(3)
    cmd = [sys.executable, "-m", "vit_fast.cli", "serve", "default", "--json", "-"]
    cmd += ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    log = tmp_path / "stderr.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        # the report's last line is its closing brace (vit_fast.util.files.json_text); EOF if the start failed
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line == "}\n":
                break
        info = json.loads("".join(lines))
        with urllib.request.urlopen(info["ready"], timeout=10) as r:
            assert r.status == 200 and info["model"] == "default"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert proc.stdout.read().strip() == ""  # nothing else ever reached stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "ready: Ctrl-C or SIGTERM stops it" in log.read_text()
    assert all(port_is_free(p) for p in ports)


def test_bad_arguments_fail_before_the_server_starts(tmp_path) -> None:
    parser = argparse.ArgumentParser(prog="vit-fast serve")
    serve.add_arguments(parser)
    for argv in (["default", "--batch", "8,x"], ["default", "--instances", "0"]):  # usage errors: test_cli_flags.py
        with pytest.raises(SystemExit, match="^2$"):
            parser.parse_args(argv)
    for argv, match in [
        (["default", "--http-port", "9000", "--grpc-port", "9000"], "different ports"),
        (["default", "--name", "a b"], "not usable by Triton"),
    ]:
        with pytest.raises(ValueError, match=match):
            serve.run(parser.parse_args(argv))


def test_later_instances_wait_for_the_first_ones_handshake(tmp_path) -> None:
    """The start-up race's cause: PyTriton's proxy code, copied into the model store for Triton's python backend
    when a model is bound, waits 1 s for the first instance's handshake; the copies this process makes wait 60 s."""
    import types

    from pytriton.models.model import Model

    from vit_fast.serve.backend import HANDSHAKE_WAIT, patient_handshake

    stand_in = types.SimpleNamespace(model_name="m", model_version=1, SCRIPT_FILES_TO_COPY=Model.SCRIPT_FILES_TO_COPY)
    stand_in._get_triton_model_config = lambda: None
    unpatched = getattr(Model.generate_model, "__wrapped__", Model.generate_model)  # an earlier test patched it

    def generate(method, store: Path) -> bytes:
        # Model.generate_model writes config.pbtxt first: stand in for that part, keep the copying of the scripts
        import pytriton.models.model as model_module

        real_generator = model_module.ModelConfigGenerator
        model_module.ModelConfigGenerator = lambda config: types.SimpleNamespace(to_file=lambda path: None)
        try:
            method(stand_in, store)
        finally:
            model_module.ModelConfigGenerator = real_generator
        return (store / "m" / "1" / "communication.py").read_bytes()

    before = generate(unpatched, tmp_path / "before")
    assert HANDSHAKE_WAIT[0].encode() in before  # the text replaced is there in this PyTriton
    patient_handshake()
    patient_handshake()  # idempotent
    after = generate(Model.generate_model, tmp_path / "after")
    assert b"timeout_s: float = 60.0" in after and HANDSHAKE_WAIT[0].encode() not in after
    assert after.replace(b"60.0", b"1.0") == before  # nothing else changed
