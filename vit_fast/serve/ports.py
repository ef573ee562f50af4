"""One owner per port: ``vit-fast serve`` holds a lock per port it serves on, for the server's whole life.

:func:`claim_ports` ``flock``s ``port-N.lock`` in this user's :func:`runtime_dir` (dropped by the kernel when the
process ends, even by SIGKILL) and names the owner's pid on a clash (:class:`PortTaken`); :func:`claim_free_ports`
adds the probe for other users' servers and programs. Why a lock and not a probe alone: docs/deploy.md."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from vit_fast.serve.endpoints import port_in_use
from vit_fast.util.files import hold_lock, read_head

#: where the lock folder lives: a fixed place per user (not $TMPDIR or $XDG_RUNTIME_DIR, which differ between a
#: user's sessions: two servers must find the same lock whatever their environment)
LOCK_ROOT = Path("/tmp")
#: how long a loser waits for the winner's pid to appear in the lock file (it is written just after the lock)
OWNER_WAIT_S = 1.0


class PortTaken(OSError):
    """A port another ``vit-fast serve`` of this user holds (the message names the port and that server's pid)."""


def runtime_dir(root: str | os.PathLike | None = None) -> Path:
    """This user's folder for serve's locks, ``ROOT/vit-fast-UID`` (ROOT: :data:`LOCK_ROOT`), made mode 0700.

    Refused (OSError naming the folder and the fix): a link, a file, or a folder another user owns or that others
    may write to. In a shared, sticky /tmp anyone could make that name first; such a folder is never used."""
    folder = Path(LOCK_ROOT if root is None else root) / f"vit-fast-{os.getuid()}"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{folder} is not a folder (a link or a file): serve keeps its port locks there; remove it")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(
            f"{folder} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: vit-fast serve keeps its "
            f"port locks in a folder only you can write; remove it (another user may have made it)"
        )
    return folder


def owner_of(lock: Path, wait_s: float = OWNER_WAIT_S) -> str:
    """The pid the holder of ``lock`` wrote there ('?' when it wrote nothing within ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        text = (read_head(lock, 64) or b"").decode("ascii", "replace").strip()
        if text.isdigit() or time.monotonic() > deadline:
            return text if text.isdigit() else "?"
        time.sleep(0.05)


def claim_ports(ports: dict[str, int], root: str | os.PathLike | None = None) -> list[int]:
    """Lock each of ``ports`` (what -> port number, e.g. ``{"HTTP": 8000}``) for this process; returns the
    descriptors that hold the locks (close them to release). If another process holds one, the locks taken
    here are released and :class:`PortTaken` names the port, its flag and the owner's pid."""
    folder = runtime_dir(root)
    held: list[int] = []
    try:
        for what, port in ports.items():
            lock = folder / f"port-{port}.lock"
            fd = hold_lock(lock, f"{os.getpid()}\n")
            if fd is None:
                raise PortTaken(
                    f"{what} port {port} is held by another vit-fast serve (pid {owner_of(lock)}): stop that "
                    f"server, or pick another port with --{what.lower()}-port"
                )
            held.append(fd)
    except BaseException:
        release_ports(held)
        raise
    return held


def release_ports(held: list[int]) -> None:
    """Release the locks :func:`claim_ports` returned (the list is emptied)."""
    while held:
        os.close(held.pop())


__all__ = ["LOCK_ROOT", "PortTaken", "claim_ports", "owner_of", "release_ports", "runtime_dir"]


def claim_free_ports(ports: dict[str, int], host: str, held: list[int]) -> list[int]:
    """Claim ``ports`` (name -> port; kept as they are where ``held`` already holds them), then make sure nothing
    listens on them: an OSError names the first port something else listens on and the flag that moves it, the
    claims released. Returns the locks held."""
    held = held or claim_ports(ports)
    for what, port in ports.items():
        if port_in_use(host, port):
            release_ports(held)
            raise OSError(
                f"{what} port {port} on {host} is already in use (another server, or another program): stop "
                f"it, or pick a free port with --{what.lower()}-port"
            )
    return held
