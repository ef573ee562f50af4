"""The seam through which resolved launches re-launch a compiled kernel (kernels/triton_seam.py), tested against the
installed triton: CI runs this file on the newest (.venv) and on the oldest supported, triton 3.6 (make test-oldest).
Triton's own launch call is read from its source, and with Triton's driver stubbed (benchmarks/host_overhead.py, in
a subprocess without TRITON_INTERPRET) a replayed launch hands the launcher what Triton's own launch handed it."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import triton
from triton import knobs
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

from vit_fast.kernels.triton_seam import Triton36To39, TritonLaunchVersionError, installed_seam, seam_for

ROOT = Path(__file__).resolve().parents[2]

#: the launcher call the 3.6-3.9 adapter makes, as Triton's own JITFunction.run writes it (whitespace dropped)
LAUNCH_CALL = (
    "kernel.run(grid_0,grid_1,grid_2,stream,kernel.function,kernel.packed_metadata,launch_metadata,"
    "knobs.runtime.launch_enter_hook,knobs.runtime.launch_exit_hook,*bound_args.values())"
)


@pytest.mark.parametrize("version", ["3.6.0", "3.7.1", "3.8.0+git1234", "3.9.0"])
def test_each_version_of_the_family_gets_its_adapter(version):
    assert seam_for(version) is Triton36To39


@pytest.mark.parametrize("version", ["3.5.1", "3.10.0", "4.0.0", "nightly"])
def test_an_unknown_triton_is_refused_naming_it_and_the_fix(version):
    with pytest.raises(TritonLaunchVersionError) as refused:
        seam_for(version)
    message = str(refused.value)
    assert f"triton {version} is installed" in message
    assert "3.6 to 3.9" in message and "backend='torch'" in message


def test_a_compiled_kernel_is_refused_on_an_unknown_triton(monkeypatch):
    """Set up for compiled launches on a triton no family knows, a kernel's resolved launches raise the adapter's
    error (naming the version) before anything compiles; under the interpreter they need no adapter."""
    from vit_fast.kernels import launches, triton_seam
    from vit_fast.kernels.linear import _linear_kernel

    monkeypatch.setattr(triton_seam, "_INSTALLED", TritonLaunchVersionError("triton 3.10.0 is installed"))
    monkeypatch.setattr(launches, "INTERPRETED", False)
    with pytest.raises(TritonLaunchVersionError, match="triton 3.10.0 is installed"):
        launches.ResolvedLaunches(_linear_kernel)
    monkeypatch.setattr(launches, "INTERPRETED", True)
    assert launches.ResolvedLaunches(_linear_kernel).seam is None


def test_the_installed_triton_launches_as_its_adapter_does():
    """The adapter chosen for the installed triton, and what it relies on, read from that triton: JITFunction.run
    calls the compiled kernel's launcher with exactly the adapter's arguments, ``CompiledKernel.run`` is the
    launcher (a property, read once per resolved launch), ``launch_metadata(grid, stream, *args)``, and the launch
    hooks are chains with their hooks in ``calls``."""
    assert installed_seam() is seam_for(triton.__version__) is Triton36To39
    source = re.sub(r"\s+", "", inspect.getsource(JITFunction.run))
    assert LAUNCH_CALL in source, f"triton {triton.__version__} changed its launch call: a new adapter is needed"
    assert isinstance(inspect.getattr_static(CompiledKernel, "run"), property)
    assert list(inspect.signature(CompiledKernel.launch_metadata).parameters) == ["self", "grid", "stream", "args"]
    for chain in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        assert isinstance(chain, knobs.HookChain) and isinstance(chain.calls, list)


def test_a_replayed_launch_hands_the_launcher_what_triton_did(tmp_path):
    """One GEMM launched through Triton's own path, then replayed through the adapter, then replayed with a launch
    hook registered: the same grid, stream, function handle, packed metadata and arguments each time (constexprs
    included). Unhooked, the replay builds no metadata and hands no hooks; hooked, it hands Triton's chains and
    metadata naming the kernel, and the hook is called."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "VIT_FAST_AUTOTUNE")}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    triton_own, replayed, hooked, called = json.loads(proc.stdout.strip().splitlines()[-1])
    assert triton_own["launch"] == replayed["launch"] == hooked["launch"]
    assert triton_own["launch"]["function"] == "'function handle'" and "weight" in triton_own["launch"]["args"]
    assert triton_own["hooks"] == ["chain", "chain", "_linear_kernel"]  # Triton builds metadata on every launch
    assert replayed["hooks"] == [None, None, None]
    assert hooked["hooks"] == ["chain", "chain", "_linear_kernel"]
    assert called == ["_linear_kernel"]


def _tensor(tensor, named: dict) -> str:
    """A tensor argument as a launch call is compared: the test's own by name, any other by dtype, shape, strides."""
    return named.get(id(tensor)) or f"{tensor.dtype} {tuple(tensor.shape)} {tensor.stride()}"


def _launch_calls() -> list:
    """Run in a subprocess: the launcher calls of the scenario above, each as ``{"launch": what must match,
    "hooks": [enter, exit, metadata's kernel name]}``, then the kernel names the hook saw."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import host_overhead

    host_overhead.install_stub_driver()
    import torch

    from vit_fast.kernels import linear

    stub = host_overhead._StubKernel
    stub.function, stub.packed_metadata = "function handle", ("packed", "metadata")  # what the launcher must get
    x, weight = torch.empty((197, 64), dtype=torch.float16), torch.empty((96, 64), dtype=torch.float16)
    calls, called = [], []

    def run(self, g0, g1, g2, stream, function, packed, metadata, enter, leave, *args):
        named = {id(x): "x", id(weight): "weight"}
        hooks = ["chain" if isinstance(h, knobs.HookChain) else h for h in (enter, leave)]
        launch = {"grid": [g0, g1, g2], "stream": stream, "function": repr(function), "packed": repr(packed)}
        launch["args"] = [_tensor(a, named) if isinstance(a, torch.Tensor) else a for a in args]
        calls.append({"launch": json.loads(json.dumps(launch, default=repr)), "hooks": hooks})
        calls[-1]["hooks"].append(None if metadata is None else metadata.get()["name"])
        if enter is not None:
            enter(metadata)

    stub.run = run
    linear.launch_linear(x, weight)  # a new shape: Triton's own dispatch
    linear.launch_linear(x, weight)  # resolved: through the adapter

    def hook(metadata) -> None:
        called.append(metadata.get()["name"])

    knobs.runtime.launch_enter_hook.add(hook)
    linear.launch_linear(x, weight)
    knobs.runtime.launch_enter_hook.remove(hook)
    return [*calls, called]


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET", "") in ("", "0")
    print(json.dumps(_launch_calls()))
