"""What keeps a `vit-fast serve` its owner's, without a server: one owner per port (a lock held for the server's
life, never a probe alone), the lock folder only its user can write, files holding a secret written 0600 from their
creation on, the request blocks narrowed to 0600, and Triton's model control switched off. The same against a real
Triton: tests/serve/test_serve_owner.py."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from vit_fast.serve import ports
from vit_fast.serve import server as srv
from vit_fast.util import files


@pytest.fixture
def lock_root(tmp_path, monkeypatch) -> Path:
    """A lock root of this test's own: the real one is shared by every serve of this user on this machine."""
    root = tmp_path / "locks"
    root.mkdir()
    monkeypatch.setattr(ports, "LOCK_ROOT", root)
    return root


def _holder(root: Path, port: int) -> subprocess.Popen:
    """Another process that claims ``port`` under ``root`` and keeps it until killed; returns once it holds it."""
    code = textwrap.dedent(f"""
        import sys, time
        from vit_fast.serve import ports
        ports.LOCK_ROOT = __import__("pathlib").Path({str(root)!r})
        ports.claim_ports({{"gRPC": {port}}})
        print("held", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_port_has_one_owner_until_it_lets_go(lock_root) -> None:
    held = ports.claim_ports({"HTTP": 18123})
    with pytest.raises(ports.PortTaken) as err:
        ports.claim_ports({"HTTP": 18123})  # another claim, even from this process, is refused
    assert str(err.value) == (
        f"HTTP port 18123 is held by another vit-fast serve (pid {os.getpid()}): stop that server, or pick "
        "another port with --http-port"
    )
    ports.release_ports(held)
    assert held == []
    ports.release_ports(ports.claim_ports({"HTTP": 18123}))


def test_the_loser_is_told_the_owners_pid_and_keeps_no_lock_of_its_own(lock_root) -> None:
    owner = _holder(lock_root, 18124)
    try:
        with pytest.raises(ports.PortTaken, match=rf"gRPC port 18124 is held by .* \(pid {owner.pid}\).*--grpc-port"):
            ports.claim_ports({"HTTP": 18125, "gRPC": 18124})
        ports.release_ports(ports.claim_ports({"HTTP": 18125}))  # the port it took first was let go
    finally:
        owner.kill()
        owner.wait()


def test_a_killed_owners_port_is_free_at_once(lock_root) -> None:
    """The kernel drops a dead process's flock, SIGKILL included: nothing stale to clean, no pid to guess."""
    owner = _holder(lock_root, 18126)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    ports.release_ports(ports.claim_ports({"gRPC": 18126}))
    lock = ports.runtime_dir() / "port-18126.lock"  # kept: removing it would let two processes lock two files
    assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o600


def test_the_lock_folder_is_this_users_alone(lock_root) -> None:
    folder = ports.runtime_dir()
    assert folder == lock_root / f"vit-fast-{os.getuid()}"
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    folder.chmod(0o777)  # made by someone else, or opened up: never used
    with pytest.raises(OSError, match=r"mode 777.*only you can write; remove it"):
        ports.runtime_dir()
    folder.rmdir()
    elsewhere = lock_root / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    folder.symlink_to(elsewhere)  # a planted link is not followed
    with pytest.raises(OSError, match=r"is not a folder \(a link or a file\)"):
        ports.runtime_dir()
    folder.unlink()
    folder.write_text("")
    with pytest.raises(OSError, match=r"is not a folder"):
        ports.runtime_dir()


def test_hold_lock_never_opens_a_link_or_a_fifo(tmp_path) -> None:
    target = tmp_path / "target"
    target.write_text("theirs")
    (tmp_path / "link.lock").symlink_to(target)
    with pytest.raises(OSError):
        files.hold_lock(tmp_path / "link.lock", "1\n")
    assert target.read_text() == "theirs"
    os.mkfifo(tmp_path / "fifo.lock")
    with pytest.raises(OSError, match="not a regular file"):
        files.hold_lock(tmp_path / "fifo.lock", "1\n")
    fd = files.hold_lock(tmp_path / "ok.lock", "42\n")
    try:
        assert files.hold_lock(tmp_path / "ok.lock", "43\n") is None
        assert (tmp_path / "ok.lock").read_text() == "42\n"
    finally:
        os.close(fd)


def test_two_servers_on_one_port_the_second_is_refused_until_the_first_stops(lock_root) -> None:
    import socket

    import vit_fast

    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        for sock in (a, b, c):
            sock.bind(("127.0.0.1", 0))
        http_port, grpc_port, metrics_port = (sock.getsockname()[1] for sock in (a, b, c))
    model = vit_fast.load_model("default", backend="torch")
    first = srv.Server(model, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, threads=1)
    second = srv.Server(model, http_port=http_port, grpc_port=grpc_port + 1, metrics_port=metrics_port, threads=1)
    first.check_ports()
    first.check_ports()  # claiming twice keeps the locks
    with pytest.raises(ports.PortTaken, match=rf"HTTP port {http_port} is held by .*pid {os.getpid()}"):
        second.check_ports()
    first.stop()  # no Triton started: stop() lets the ports go all the same
    second.check_ports()
    second.stop()


@pytest.mark.parametrize("before", [None, 0o600, 0o644])
def test_a_secret_is_written_0600_whatever_the_file_it_replaces_allowed(tmp_path, before) -> None:
    path = tmp_path / "ready.json"
    if before is not None:
        path.write_text("{}")
        path.chmod(before)
        files.claim(path)  # what a check before the work does: this file may be replaced
    files.write_json_atomic({"access_token": "s3cret"}, path, mode=0o600)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    files.write_json_atomic({"access_token": None}, path)  # without mode: ordinary permissions, as before
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~files.base.current_umask()


def test_the_request_blocks_are_narrowed_to_their_user_and_nothing_else(tmp_path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    ours = [shm / "pytrtion123-ab-1", shm / "pytrtion123-ab-2"]
    for p in ours:
        p.write_bytes(b"request")
        p.chmod(0o644)
    other = shm / "pytrtion1234-cd-1"  # another server's (pid 1234, not 123)
    other.write_bytes(b"")
    other.chmod(0o644)
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    outside.chmod(0o644)
    (shm / "pytrtion123-ab-link").symlink_to(outside)
    assert srv.make_shm_private("pytrtion123-ab", shm) == ours
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in ours] == [0o600, 0o600]
    assert stat.S_IMODE(os.stat(other).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o644  # a link is never followed


def test_model_control_is_switched_off_or_the_start_refused() -> None:
    config = {"model-control-mode": "explicit", "load-model": "*"}
    triton = SimpleNamespace(
        _triton_server_config=config, _triton_lifecycle_policy=SimpleNamespace(local_model_store=True)
    )
    srv.close_model_control(triton)
    assert config == {"model-control-mode": "none", "load-model": None}
    for broken in (
        SimpleNamespace(_triton_lifecycle_policy=SimpleNamespace(local_model_store=True)),  # another PyTriton
        SimpleNamespace(_triton_server_config={}, _triton_lifecycle_policy=SimpleNamespace(local_model_store=False)),
    ):
        with pytest.raises(RuntimeError, match=r"cannot close Triton's model-control API .*nvidia-pytriton 0\.7\.0"):
            srv.close_model_control(broken)
