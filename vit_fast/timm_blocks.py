"""timm's transformer blocks on our kernels: what :func:`vit_fast.apply_vit_fast` runs in place of a timm block's
forward.

:func:`plan_timm_model` reads every block of a timm ``VisionTransformer`` / ``VisionTransformerDistilled`` before
anything is patched and returns one :class:`BlockPlan` per block, or raises a ValueError naming each feature the
kernels do not run (rotary or relative position attention, qk-norm, gated attention, RmsNorm, ...). Block kinds run:

    Block                 x = x + ls1(attn(norm1(x)));  x = x + ls2(mlp(norm2(x)))          (pre-norm)
    ResPostBlock          x = x + norm1(attn(x));       x = x + norm2(mlp(x))                (post-norm)
    ParallelThingsBlock   x = x + sum_i ls(attn_i(norm_i(x)));  x = x + sum_i ls(mlp_i(norm_i(x)))

with timm's ``Mlp`` (GELU, tanh GELU, QuickGELU or SiLU in the fc1 GEMM's epilogue) or ``GluMlp`` (SwiGLU: fc1
and fc2 on the kernels, the gate ``act(x1) * x2`` in torch between them), and timm's ``Attention`` or
``DiffAttention`` (differential attention: one kernel with its sub_norm RmsNorm in the epilogue; its lambda computed
by timm's own ``_compute_lambda`` in torch, a few tiny ops, no host sync). Everything outside the blocks (patch or
hybrid embedding, pooling, attention-pool heads, distillation heads) stays timm's own code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import runtime

#: timm model classes whose blocks are read here, and the ones refused for what their attention does
MODEL_CLASSES = ("VisionTransformer", "VisionTransformerDistilled")
_REFUSED_MODELS = {
    "Eva": "rotary position embeddings (RoPE) inside attention",
    "VisionTransformerRelPos": "relative position bias inside attention",
}
_REFUSED_BLOCKS = {
    "ParallelScalingBlock": "parallel scaling block (one fused in_proj for attention and MLP, RmsNorm, qk-norm)",
    "DiffParallelScalingBlock": "differential attention (DiffParallelScalingBlock)",
}
_BLOCK_INDEX = re.compile(r"^blocks\.\d+")
#: activation module class name -> the linear kernel's epilogue (nn.GELU is read by its ``approximate``)
_ACTIVATIONS = {"GELU": "gelu", "GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu", "Swish": "silu"}


@dataclass(frozen=True)
class MlpPlan:
    act: str  # the linear kernel's activation name
    gated: bool = False  # timm GluMlp: fc1 gives [x1 | x2], then act(x1) * x2 (or x1 * act(x2) with gate_last)
    gate_last: bool = False


@dataclass(frozen=True)
class BlockPlan:
    """How one timm block runs on the kernels: its kind, each MLP's activation, and its attention head dim."""

    kind: str  # "Block", "ResPostBlock" or "ParallelThingsBlock"
    mlps: tuple[MlpPlan, ...]
    head_dim: int

    def run(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The block's forward on the kernels, ``x [B, T, D]`` -> ``[B, T, D]``."""
        from . import first_use
        from .triton_path import _CHECKED_THROUGH, _THROUGH_OPS, fuse_ln_from_env

        checked = first_use.enabled() and (first_use.failed_ops() or first_use.eligible(x))
        ops = _CHECKED_THROUGH if checked else _THROUGH_OPS
        fused = fuse_ln_from_env()
        x = x.contiguous()  # a model without prefix tokens hands its patch embedding's transposed view to block 0
        if self.kind == "Block":
            x = _attention(ops, block.norm1, block.attn, x, x, block.ls1, fused)
            return _mlp(ops, block.norm2, block.mlp, self.mlps[0], x, x, block.ls2, fused)
        if self.kind == "ResPostBlock":
            x = x + _norm(ops, block.norm1, _attention(ops, nn.Identity(), block.attn, x, None, None, fused))
            return x + _norm(ops, block.norm2, _mlp(ops, nn.Identity(), block.mlp, self.mlps[0], x, None, None, fused))
        # ParallelThingsBlock: each branch reads the block's input; the residual chain sums their outputs
        out = x
        for branch in block.attns:
            out = _attention(ops, branch.norm, branch.attn, x, out, branch.ls, fused)
        x = out
        for branch, mlp_plan in zip(block.ffns, self.mlps, strict=True):
            out = _mlp(ops, branch.norm, branch.mlp, mlp_plan, x, out, branch.ls, fused)
        return out


def _norm(ops, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from .triton_path import _norm as norm_on_kernels

    return norm_on_kernels(ops, norm, x)


def _attention(ops, norm, attn, x, residual, ls, fused) -> torch.Tensor:
    """``residual + ls(attn(norm(x)))`` (``attn(norm(x))`` when residual is None): 3 launches, LN in the qkv GEMM."""
    from .triton_path import _gamma, _norm_linear

    qkv = _norm_linear(ops, norm, x, attn.qkv, None, fused)  # [B, T, 3 * H * Dh]
    if type(attn).__name__ == "DiffAttention":
        a = _diff_attention(ops, attn, qkv)
    else:
        a = ops.attention(qkv, attn.num_heads, attn.scale)  # [B, T, H * Dh]
    if residual is None:
        return ops.linear(a, attn.proj)
    return ops.linear(a, attn.proj, residual=residual, gamma=_gamma(ls))


def _diff_attention(ops, attn, qkv: torch.Tensor) -> torch.Tensor:
    """timm ``DiffAttention`` from its qkv output to before proj (``[B, T, 3D] -> [B, T, D]``): both softmaxes,
    lambda, the sub_norm RmsNorm and ``1 - lambda_init`` in one kernel. lambda is timm's own ``_compute_lambda()``,
    cast to qkv's dtype as timm casts it, and stays on the device (the kernel reads it)."""
    lambda_full = attn._compute_lambda().to(qkv.dtype)
    sub_norm = attn.sub_norm
    return ops.diff_attention(
        qkv, lambda_full, sub_norm.weight, attn.num_heads, float(attn.lambda_init), attn.scale, sub_norm.eps
    )


def _mlp(ops, norm, mlp, plan: MlpPlan, x, residual, ls, fused) -> torch.Tensor:
    """``residual + ls(mlp(norm(x)))`` (``mlp(norm(x))`` when residual is None); the activation rides in fc1's
    epilogue, a SwiGLU gate runs in torch between fc1 and fc2."""
    from .triton_path import _gamma, _norm_linear

    if plan.gated:
        h = _norm_linear(ops, norm, x, mlp.fc1, None, fused)
        x1, x2 = h.chunk(2, dim=-1)
        h = x1 * _act_ref(x2, plan.act) if plan.gate_last else _act_ref(x1, plan.act) * x2
    else:
        h = _norm_linear(ops, norm, x, mlp.fc1, plan.act, fused)
    if residual is None:
        return ops.linear(h, mlp.fc2)
    return ops.linear(h, mlp.fc2, residual=residual, gamma=_gamma(ls))


def _act_ref(x: torch.Tensor, act: str) -> torch.Tensor:
    if act == "gelu":
        return F.gelu(x)
    if act == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if act == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    return F.silu(x)


# --------------------------------------------------------------------------- reading a timm model
def _is_identity(module) -> bool:
    return module is None or isinstance(module, nn.Identity)


def _activation(act, where: str, problems: list[str]) -> str:
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    name = type(act).__name__
    if name in _ACTIVATIONS and (isinstance(act, nn.SiLU) or type(act).__module__.startswith("timm.")):
        return _ACTIVATIONS[name]
    problems.append(f"{where}.act {name} (the kernels run GELU, tanh GELU, QuickGELU and SiLU)")
    return "gelu"


def _norm_problems(norm, where: str, problems: list[str], allow_identity: bool = False) -> None:
    if isinstance(norm, nn.LayerNorm) or (allow_identity and _is_identity(norm)):
        return
    problems.append(f"{where} {type(norm).__name__} (the kernels run LayerNorm)")


def _attention_problems(attn, where: str, problems: list[str]) -> int:
    """The head dim of a timm ``Attention`` with a fused qkv (of a ``DiffAttention``: its output heads'); anything
    else goes into ``problems``."""
    if type(attn).__name__ == "DiffAttention":
        return _diff_attention_problems(attn, where, problems)
    if type(attn).__name__ != "Attention" or not isinstance(getattr(attn, "qkv", None), nn.Linear):
        problems.append(f"{where} {type(attn).__name__} (the kernels run timm's Attention with a fused qkv)")
        return 0
    for part, what in (("q_norm", "qk-norm"), ("k_norm", "qk-norm"), ("norm", "scale_attn_norm")):
        if not _is_identity(getattr(attn, part, None)):
            problems.append(f"{where}.{part} ({what})")
    if getattr(attn, "gate", None) is not None:
        problems.append(f"{where}.gate (gated attention)")
    if getattr(attn, "qkv_bias_separate", False):
        problems.append(f"{where} qkv_bias_separate")
    if not isinstance(getattr(attn, "proj", None), nn.Linear):
        problems.append(f"{where}.proj {type(getattr(attn, 'proj', None)).__name__} (a Linear is expected)")
    head_dim = int(attn.head_dim)
    if attn.qkv.out_features != 3 * attn.num_heads * head_dim:
        problems.append(f"{where}.qkv gives {attn.qkv.out_features} features, not 3 x heads x head_dim")
    return head_dim


def _diff_attention_problems(attn, where: str, problems: list[str]) -> int:
    """What the differential attention kernel needs of a timm ``DiffAttention``: a fused qkv Linear of
    ``3 * H * 2 * Dh`` features, a Linear proj, an affine RmsNorm ``sub_norm`` over ``2 * Dh``, timm's
    ``_compute_lambda``, no q/k norm and no scale norm (each refused by name). Returns the output head dim, ``2 * Dh``
    (16..256 for the kernel's 8..128 q/k head dims, the range ``runtime.head_dim_supported`` checks).
    An ``attn_mask`` or ``is_causal`` reaches only timm's own forward (the patched block hands such calls back)."""
    if not isinstance(getattr(attn, "qkv", None), nn.Linear):
        problems.append(f"{where} DiffAttention without a fused qkv Linear")
        return 0
    for part, what in (("q_norm", "qk-norm"), ("k_norm", "qk-norm"), ("norm", "scale_attn_norm")):
        if not _is_identity(getattr(attn, part, None)):
            problems.append(f"{where}.{part} ({what} in differential attention)")
    if not isinstance(getattr(attn, "proj", None), nn.Linear):
        problems.append(f"{where}.proj {type(getattr(attn, 'proj', None)).__name__} (a Linear is expected)")
    head_dim, heads = int(attn.head_dim), int(attn.num_heads)
    if attn.qkv.out_features != 3 * heads * 2 * head_dim:
        problems.append(f"{where}.qkv gives {attn.qkv.out_features} features, not 3 x heads x 2 x head_dim")
    sub_norm = getattr(attn, "sub_norm", None)
    weight = getattr(sub_norm, "weight", None)
    if type(sub_norm).__name__ != "RmsNorm" or not isinstance(weight, torch.Tensor) or weight.shape != (2 * head_dim,):
        problems.append(f"{where}.sub_norm {type(sub_norm).__name__} (an affine RmsNorm over 2 x head_dim is expected)")
    if not callable(getattr(attn, "_compute_lambda", None)):
        problems.append(f"{where} DiffAttention without _compute_lambda (a timm version vit-fast does not know)")
    return 2 * head_dim


def _mlp_plan(mlp, where: str, problems: list[str]) -> MlpPlan:
    name = type(mlp).__name__
    if name not in ("Mlp", "GluMlp") or not all(isinstance(getattr(mlp, f, None), nn.Linear) for f in ("fc1", "fc2")):
        problems.append(f"{where} {name} (the kernels run timm's Mlp and GluMlp with Linear layers)")
        return MlpPlan("gelu")
    if not _is_identity(getattr(mlp, "norm", None)):
        problems.append(f"{where}.norm (scale_mlp_norm)")
    act = _activation(getattr(mlp, "act", None), where, problems)
    if name == "GluMlp":
        if getattr(mlp, "chunk_dim", -1) != -1:
            problems.append(f"{where} GluMlp chunk_dim={mlp.chunk_dim}")
        return MlpPlan(act, gated=True, gate_last=bool(getattr(mlp, "gate_last", True)))
    return MlpPlan(act)


def _layer_scale_problems(ls, where: str, problems: list[str]) -> None:
    if not _is_identity(ls) and not isinstance(getattr(ls, "gamma", None), torch.Tensor):
        problems.append(f"{where} {type(ls).__name__} (LayerScale with a gamma, or none)")


def _block_plan(block: nn.Module, where: str, problems: list[str]) -> BlockPlan:
    kind = type(block).__name__
    if kind in _REFUSED_BLOCKS:
        problems.append(f"{where}: {_REFUSED_BLOCKS[kind]}")
        return BlockPlan(kind, (), 0)
    if kind in ("Block", "ResPostBlock"):
        head_dim = _attention_problems(block.attn, f"{where}.attn", problems)
        _norm_problems(block.norm1, f"{where}.norm1", problems)
        _norm_problems(block.norm2, f"{where}.norm2", problems)
        for ls in ("ls1", "ls2"):
            _layer_scale_problems(getattr(block, ls, None), f"{where}.{ls}", problems)
        return BlockPlan(kind, (_mlp_plan(block.mlp, f"{where}.mlp", problems),), head_dim)
    if kind == "ParallelThingsBlock":
        head_dims = set()
        for i, branch in enumerate(block.attns):
            head_dims.add(_attention_problems(branch.attn, f"{where}.attns.{i}.attn", problems))
            _norm_problems(branch.norm, f"{where}.attns.{i}.norm", problems, allow_identity=True)
            _layer_scale_problems(branch.ls, f"{where}.attns.{i}.ls", problems)
        mlps = []
        for i, branch in enumerate(block.ffns):
            mlps.append(_mlp_plan(branch.mlp, f"{where}.ffns.{i}.mlp", problems))
            _norm_problems(branch.norm, f"{where}.ffns.{i}.norm", problems, allow_identity=True)
            _layer_scale_problems(branch.ls, f"{where}.ffns.{i}.ls", problems)
        return BlockPlan(kind, tuple(mlps), min(head_dims) if head_dims else 0)
    problems.append(f"{where} {kind} (the kernels run timm's Block, ResPostBlock and ParallelThingsBlock)")
    return BlockPlan(kind, (), 0)


def plan_timm_model(model: nn.Module, backend: str) -> list[BlockPlan]:
    """One plan per block of a timm ViT, after checking all of them; a ValueError names every feature the kernels
    do not run (each at most once, with the first block that has it), and with ``backend="triton"`` a head dim
    the attention kernel does not take."""
    name = type(model).__name__
    if name in _REFUSED_MODELS:
        raise ValueError(
            f"apply_vit_fast: timm {name} uses {_REFUSED_MODELS[name]}, which vit-fast's kernels do not run: "
            "run this model unpatched"
        )
    if name not in MODEL_CLASSES:
        raise ValueError(
            f"apply_vit_fast: timm model class {name} is not one vit-fast patches ({', '.join(MODEL_CLASSES)}): "
            "run this model unpatched"
        )
    blocks = list(getattr(model, "blocks", None) or [])
    if not blocks:
        raise ValueError(f"apply_vit_fast: timm {name} has no transformer blocks (model.blocks is empty)")
    problems: list[str] = []
    plans = []
    for i, block in enumerate(blocks):
        found: list[str] = []
        plans.append(_block_plan(block, f"blocks.{i}", found))
        for problem in found:  # name each feature once: 'blocks.3.attn.q_norm' repeats 'blocks.0.attn.q_norm'
            if _BLOCK_INDEX.sub("", problem) not in {_BLOCK_INDEX.sub("", p) for p in problems}:
                problems.append(problem)
    if problems:
        raise ValueError(
            f"apply_vit_fast: timm {name} uses features vit-fast's kernels do not run: {'; '.join(problems)}. "
            "Run this model unpatched"
        )
    if backend == "triton":
        for head_dim in sorted({p.head_dim for p in plans}):
            if not runtime.head_dim_supported(head_dim):
                low, high = runtime.head_dim_range()
                raise ValueError(
                    f"apply_vit_fast(backend='triton'): the attention kernel takes head dims {low}..{high}, this "
                    f"model's is {head_dim}: use backend='auto' (it keeps timm's attention where ours cannot run)"
                )
    return plans
