"""The demo's triton step on a CPU: ``vit-fast verify default triton`` in a child process started with
TRITON_INTERPRET=1, running beside the export; the child dies with the demo."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from typing import Any

from vit_fast.backend.env import module_version
from vit_fast.util.children import guarded_python
from vit_fast.util.files import read_json, temp_staging

from .base import step_record, verified_step

#: the random-input batches the interpreter child verifies beside the held-out subset (small: it is slow)
INTERPRETER_BATCHES = "1,3"


class InterpreterVerify:
    """The triton step on a CPU: ``vit-fast verify default triton`` in a child process with TRITON_INTERPRET=1,
    running while this process exports. The child dies with the demo, even by SIGKILL, and removes the demo's
    temporary folder then; its log is an unnamed file. Why a child, and how: docs/cli.md, section "The triton step
    in a child process"."""

    def __init__(self, images: int, seed: int, timeout: float) -> None:
        self.images, self.timeout = images, timeout
        self.scope = contextlib.ExitStack()
        self.tmp = self.scope.enter_context(temp_staging("vit-fast-demo"))
        self.json = self.tmp / "triton.json"
        self.log = self.scope.enter_context(tempfile.TemporaryFile("w+"))
        cmd = guarded_python(["vit_fast", "verify", "default", "triton", "--limit", str(images)], cleanup=self.tmp)
        cmd += ["--batch", INTERPRETER_BATCHES, "--seed", str(seed), "--json", str(self.json)]
        # one thread, so the export running beside it keeps its cores; no GPU, so the kernels run interpreted
        env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        self.started = time.perf_counter()
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        except BaseException:
            self.scope.close()
            raise

    def collect(self) -> dict[str, Any]:
        """The triton step, once the child has ended (at most ``timeout`` seconds after its start)."""
        try:
            self.proc.wait(timeout=max(1.0, self.timeout - (time.perf_counter() - self.started)))
        except subprocess.TimeoutExpired:
            why = f"the run on {self.images} images took longer than {self.timeout:g} s"
            return step_record("triton", False, f"interpreter: {why} (lower --subset or raise --triton-timeout)")
        wall = time.perf_counter() - self.started
        report = read_json(self.json, "the interpreter run's report") if self.json.is_file() else None
        if report is None or report.get("complete") is False:  # it could not run (or finish): its last line says why
            self.log.seek(0)
            last = (self.log.read().strip().splitlines() or ["no output"])[-1]
            return step_record("triton", False, f"interpreter: vit-fast verify exited {self.proc.returncode}: {last}")
        head = f"interpreter, {report['accuracy']['n']} images: "
        version = module_version("triton")
        return verified_step("triton", report, head, mode="interpreter", wall_s=wall, triton_version=version)

    def close(self) -> None:
        """Stop the child if it still runs (the demo ended before collecting it); remove its files."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.scope.close()
