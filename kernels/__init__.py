"""Triton kernels, installed as ``vit_fast.kernels``: one file per fused op (kernel, launcher, ``torch.library`` op,
eager reference ``<op>_ref``), and :data:`KERNELS` / :data:`OPS`, the one registry every tool and test reads to find
a kernel by name (docs/development.md, "Adding a kernel"). Importing it touches no GPU driver and imports no triton;
with a triton older than ``versions.MIN_TRITON`` it warns once (:class:`TritonVersionWarning`) and vit-fast stays on
the torch backend (docs/install.md)."""

import importlib as _importlib
import math as _math
import warnings as _warnings
from dataclasses import dataclass as _dataclass
from dataclasses import field as _field
from types import ModuleType as _ModuleType
from typing import Any as _Any

# absolute, not relative: with the repository's root on sys.path (pytest), transformers' check for PyPI's `kernels`
# imports this folder as a top-level package, and a relative import beyond it would fail there
from vit_fast.base.versions import triton_problem as _triton_problem


class TritonVersionWarning(UserWarning):
    """The installed triton is too old for vit-fast's kernels (the message says which and the fix)."""


_PROBLEM = _triton_problem()
if _PROBLEM is not None:
    _warnings.warn(f"{_PROBLEM}. Until then vit-fast runs the torch backend.", TritonVersionWarning, stacklevel=2)


@_dataclass(frozen=True)
class Kernel:
    """One kernel file, ``vit_fast.kernels.<name>``: its Triton kernel, the function ``_<name>_kernel`` (autotuned or
    plain ``@triton.jit``; Triton and :func:`~.launches.record_launches` name it so), and that kernel's
    :class:`~.launches.ResolvedLaunches` ``_<name>_launches``, through which every launcher of the file launches it.
    Read when asked, so a tool may replace one for a while."""

    name: str
    kernel_name: str = _field(init=False)  # the Triton kernel: ``_<name>_kernel``
    launches_name: str = _field(init=False)  # its launches: ``_<name>_launches``

    def __post_init__(self) -> None:
        object.__setattr__(self, "kernel_name", f"_{self.name}_kernel")
        object.__setattr__(self, "launches_name", f"_{self.name}_launches")

    @property
    def module(self) -> _ModuleType:
        return _importlib.import_module(f"{__name__}.{self.name}")

    @property
    def kernel(self) -> _Any:
        return getattr(self.module, self.kernel_name)

    @property
    def launches(self) -> _Any:
        return getattr(self.module, self.launches_name)

    @property
    def configs(self) -> list:
        """The autotune candidates before any prune (empty for a kernel that is not autotuned)."""
        return list(getattr(self.kernel, "configs", None) or ())

    @property
    def compile_variants(self) -> _Any:
        """``compile_variants(v, variant_set, full)``: the cases ``tools/compile_check.py`` compiles of this kernel,
        from its file (its ``<name>_tiles`` file where the kernel file is at the size cap)."""
        return self._compile_spec("compile_variants")

    @property
    def compile_launch(self) -> _Any:
        """``compile_launch(v, params)``: one case's launch, recorded through ``v.record`` (beside the variants)."""
        return self._compile_spec("compile_launch")

    def _compile_spec(self, name: str) -> _Any:
        found = getattr(self.module, name, None)
        if found is None:
            found = getattr(_importlib.import_module(f"{__name__}.{self.name}_tiles"), name)
        return found


@_dataclass(frozen=True)
class Op:
    """One fused op: ``name`` (its public function and its ``torch.library`` op ``vit_fast::<name>``), the
    :class:`Kernel` that runs it, its launcher and eager reference (names in that file, looked up when asked, so a
    test may replace one), and ``family``: ``None`` where a ``ViTConfig`` model launches it (doctor checks it at that
    model's shapes), else the sizes of the one timm model whose blocks or head, patched in place, launch it
    (``model``, ``tokens``, ``heads``, ``head_dim`` and what else its check needs)."""

    name: str
    kernel: Kernel
    launcher_name: str
    reference_name: str
    family: dict[str, _Any] | None = None

    @property
    def op(self) -> _Any:
        return getattr(self.kernel.module, self.name)

    @property
    def spec(self) -> _Any:
        """What ``_launch.define_op`` made of it, ``_<name>``: ``op``, ``launch``, ``check``, ``empty``, ``reference``."""
        return getattr(self.kernel.module, f"_{self.name}")

    @property
    def launcher(self) -> _Any:
        return getattr(self.kernel.module, self.launcher_name)

    @property
    def reference(self) -> _Any:
        return getattr(self.kernel.module, self.reference_name)


#: every kernel file, by name
KERNELS: dict[str, Kernel] = {
    name: Kernel(name)
    for name in ("patch_embed", "layer_norm", "attention", "attention_pool", "diff_attention", "linear", "preprocess")
}

#: ParallelScalingBlock with an RmsNorm in_norm (folded into its fc1 and qkv GEMMs) and RmsNorm qk-norm, no qkv bias
_RMS_FAMILY = dict(model="vit_base_patch16_xp_224", tokens=197, heads=12, head_dim=64, mlp_ratio=4.0, eps=1e-6)

#: every op, by name, in the order doctor lists them: a ViT block's, then the patched timm / Hugging Face models'
OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op("patch_embed", KERNELS["patch_embed"], "launch_patch_embed", "patch_embed_ref"),
        Op("layer_norm_linear", KERNELS["linear"], "launch_linear", "layer_norm_linear_ref"),
        Op("attention", KERNELS["attention"], "launch_attention", "attention_ref"),
        Op("linear", KERNELS["linear"], "launch_linear", "linear_ref"),
        Op("layer_norm", KERNELS["layer_norm"], "launch_layer_norm", "add_layer_norm_ref"),
        Op("add_layer_norm", KERNELS["layer_norm"], "launch_add_layer_norm", "add_layer_norm_ref"),
        Op("rms_norm", KERNELS["layer_norm"], "launch_rms_norm", "rms_norm_ref", _RMS_FAMILY),
        Op("rms_norm_linear", KERNELS["linear"], "launch_linear", "rms_norm_linear_ref", _RMS_FAMILY),
        # DiffAttention (its Dh is dim / heads / 2), no class token and one register; lambda_init of its last
        # block (depth 13)
        Op(
            "diff_attention",
            KERNELS["diff_attention"],
            "launch_diff_attention",
            "diff_attention_ref",
            dict(
                model="vit_dlittle_patch16_reg1_gap_256",
                tokens=257,
                heads=5,
                head_dim=32,
                lambda_init=0.8 - 0.6 * _math.exp(-3.9),
            ),
        ),
        # AttentionPoolLatent (global_pool='map') with one latent query, over the patch tokens (no class token); the
        # SigLIP pooling head of transformers launches it the same way
        Op(
            "attention_pool",
            KERNELS["attention_pool"],
            "launch_attention_pool",
            "attention_pool_ref",
            dict(model="vit_base_patch16_siglip_224", tokens=196, heads=12, head_dim=64, latents=1),
        ),
        # uint8 images at their decoded sizes to a model's input (resize, centre crop, normalise): before the model,
        # so no model launches it and doctor does not check it
        Op("preprocess", KERNELS["preprocess"], "launch_preprocess", "preprocess_ref"),
    )
}
