"""Nothing touches a GPU driver at import time, and a CPU tensor is refused before any launch when
the interpreter is off. Run in a fresh process without TRITON_INTERPRET, so the kernels are in
compiled mode (full autotune lists) on a machine that may have no GPU driver at all."""

import os
import subprocess
import sys

CODE = """
import torch
import vit_fast, vit_fast.backend.triton_path
import vit_fast.kernels.attention as attention
import vit_fast.kernels.attention_pool as attention_pool
import vit_fast.kernels.layer_norm as layer_norm
import vit_fast.kernels.linear as linear
import vit_fast.kernels.patch_embed as patch_embed
from vit_fast.kernels import KERNELS

assert len(KERNELS["attention"].kernel.configs) > 1
assert len(KERNELS["attention_pool"].kernel.configs) > 1
assert len(KERNELS["linear"].kernel.configs) > 1
assert len(KERNELS["patch_embed"].kernel.configs) > 1
calls = {
    "attention": lambda: attention.attention(torch.randn(1, 5, 96), 2),
    "attention_pool": lambda: attention_pool.attention_pool(torch.randn(1, 1, 32), torch.randn(1, 5, 64), 2),
    "linear": lambda: linear.linear(torch.randn(3, 8), torch.randn(4, 8)),
    "layer_norm": lambda: layer_norm.layer_norm(torch.randn(3, 8), torch.ones(8), torch.zeros(8), 1e-6),
    "patch_embed": lambda: patch_embed.patch_embed(
        torch.randn(1, 3, 8, 8), torch.randn(4, 3, 4, 4), torch.zeros(4), torch.zeros(1, 5, 4), torch.zeros(1, 1, 4)
    ),
}
for name, call in calls.items():
    try:
        call()
    except RuntimeError as err:
        assert "CUDA tensor" in str(err) and "TRITON_INTERPRET=1" in str(err), (name, str(err))
    else:
        raise AssertionError(f"{name}: a CPU tensor was accepted without TRITON_INTERPRET")
assert not torch.cuda.is_initialized(), "importing or checking initialised CUDA"
print("ok")
"""


def test_import_touches_no_gpu_driver_and_cpu_tensors_are_refused():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_registry_names_every_kernel_file_and_every_op():
    """``vit_fast.kernels.KERNELS`` holds every file that defines a Triton kernel ``_<file>_kernel`` and ``OPS`` every
    op our kernels register with ``torch.library``: a kernel added without its registry line fails here."""
    from pathlib import Path

    import torch

    import vit_fast.kernels
    from vit_fast.kernels import KERNELS, OPS

    root = Path(vit_fast.kernels.__file__).parent
    files = {p.stem for p in root.glob("*.py") if f"def _{p.stem}_kernel(" in p.read_text()}
    assert files == set(KERNELS)
    for entry in KERNELS.values():
        assert entry.launches.kernel is entry.kernel, entry.name
    for name, op in OPS.items():
        assert op.op.__name__ == name and callable(op.launcher) and callable(op.reference), name
        assert op.kernel in KERNELS.values() and (op.family is None or {"model", "tokens", "heads"} <= set(op.family))
    registered = {
        n for n in dir(torch.ops.vit_fast) if isinstance(getattr(torch.ops.vit_fast, n), torch._ops.OpOverloadPacket)
    }
    assert registered == set(OPS)


def test_every_op_is_made_by_the_one_helper():
    """``torch.library.custom_op``, an op's fake and its backward are written in one place, ``_launch.define_op``:
    a kernel file that registers its op by hand fails here, as does an op that is not a ``define_op`` call."""
    from pathlib import Path

    import torch

    import vit_fast.kernels
    from vit_fast.kernels import OPS

    root = Path(vit_fast.kernels.__file__).parent
    words = ("torch.library.custom_op", "register_fake", "register_autograd", "register_recompute_backward(")
    by_hand = {p.name for p in root.glob("*.py") if p.name != "_launch.py" and any(w in p.read_text() for w in words)}
    assert by_hand == set()
    for name, op in OPS.items():  # the registry reaches each op's spec, ``_<name>`` in its kernel file
        spec = op.spec
        assert isinstance(spec.op, torch.library.CustomOpDef) and spec.op._qualname == f"vit_fast::{name}", name
        assert spec.launch.__name__ == f"_{name}_op" and callable(spec.check) and callable(spec.reference), name
