"""Reading a timm model before anything is patched: :func:`plan_timm_model` gives one
:class:`vit_fast.interop.timm_blocks.BlockPlan` per block (and :func:`plan_attention_pool` the head's
:class:`~vit_fast.interop.timm_blocks.PoolPlan`), or a ValueError naming each feature the kernels do not run (rotary
relative position attention, qk-norm outside ParallelScalingBlock, a norm other than LayerNorm or RmsNorm, ...).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from vit_fast.backend import runtime
from vit_fast.interop.naflex import MODEL_CLASSES as NAFLEX_CLASSES
from vit_fast.interop.naflex import naflex_refusal
from vit_fast.interop.timm_blocks import BlockPlan, MlpPlan, PoolPlan, is_identity
from vit_fast.model.layers import is_rms_norm

#: timm model classes whose blocks are read here (NaFlexVit: :mod:`vit_fast.interop.naflex`), and the ones refused for
#: what their attention does
MODEL_CLASSES = ("VisionTransformer", "VisionTransformerDistilled", "Eva", *NAFLEX_CLASSES)
_REFUSED_MODELS = {
    "VisionTransformerRelPos": "relative position bias inside attention",
    "Beit": "relative position bias inside attention",
    "VisionTransformerSAM": "windowed attention with relative position embeddings",
    "Gemma4VitEncoder": "2D rotary position embeddings (RoPE) and RMSNorm on q, k and v inside attention",
    "Gemma4VitClassifier": "2D rotary position embeddings (RoPE) and RMSNorm on q, k and v inside attention",
    "Qwen3VitEncoder": "rotary position embeddings (RoPE) inside attention",
    "Qwen3VitClassifier": "rotary position embeddings (RoPE) inside attention",
    "DeepseekVitEncoder": "rotary position embeddings (RoPE) inside attention, with a SwiGLU MLP",
    "DeepseekVitClassifier": "rotary position embeddings (RoPE) inside attention, with a SwiGLU MLP",
}
#: the timm block classes whose forward runs on the kernels (each read by :func:`_block_plan`)
BLOCK_KINDS = (
    *("Block", "ResPostBlock", "ParallelThingsBlock", "ParallelScalingBlock", "DiffParallelScalingBlock"),
    "EvaBlock",
)
#: the attentions of an ``EvaBlock`` read by :func:`_eva_plan` (both rotate q and k with the table timm passes in)
_EVA_ATTENTIONS = ("EvaAttention", "AttentionRope")
#: the ``blocks.N`` prefix of a block's refusal (a model's refusal names the block; a row of one block need not)
BLOCK_INDEX = re.compile(r"^blocks\.\d+")
#: activation module class name -> the linear kernel's epilogue (nn.GELU is read by its ``approximate``)
_ACTIVATIONS = {"GELU": "gelu", "GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu", "Swish": "silu"}


# --------------------------------------------------------------------------- reading a timm model
def _activation(act, where: str, problems: list[str]) -> str:
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    name = type(act).__name__
    if name in _ACTIVATIONS and (isinstance(act, nn.SiLU) or type(act).__module__.startswith("timm.")):
        return _ACTIVATIONS[name]
    problems.append(f"{where}.act {name} (the kernels run GELU, tanh GELU, QuickGELU and SiLU)")
    return "gelu"


def _norm_problems(norm, where: str, problems: list[str], allow_identity: bool = False) -> None:
    """A LayerNorm or timm RmsNorm / RmsNormFp32 over one (the last) dim, or Identity where allowed; else a problem.
    Both run on the norm kernel (or folded into the next GEMM's prologue), in its LayerNorm or RMS mode."""
    if allow_identity and is_identity(norm):
        return
    if not (isinstance(norm, nn.LayerNorm) or is_rms_norm(norm)):
        problems.append(f"{where} {type(norm).__name__} (the kernels run LayerNorm and timm's RmsNorm)")
    elif len(norm.normalized_shape) != 1:
        problems.append(f"{where} normalises {tuple(norm.normalized_shape)} (the kernels normalise the last dim)")


def _attention_extras(attn, where: str, problems: list[str], norm: str, why: str = "") -> None:
    """What no attention kernel runs, each a problem by name: qk-norm, a ``norm`` inside attention, a gate, a qkv bias
    added separately."""
    for part, what in (("q_norm", "qk-norm"), ("k_norm", "qk-norm"), ("norm", norm)):
        if not is_identity(getattr(attn, part, None)):
            problems.append(f"{where}.{part} ({what}{why})")
    if getattr(attn, "gate", None) is not None:
        problems.append(f"{where}.gate (gated attention)")
    if getattr(attn, "qkv_bias_separate", False):
        problems.append(f"{where} qkv_bias_separate")


def _attention_problems(attn, where: str, problems: list[str]) -> int:
    """The head dim of a timm ``Attention`` with a fused qkv (of a ``DiffAttention``: its output heads'); anything
    else goes into ``problems``."""
    if type(attn).__name__ == "DiffAttention":
        return _diff_attention_problems(attn, where, problems)
    if type(attn).__name__ != "Attention" or not isinstance(getattr(attn, "qkv", None), nn.Linear):
        problems.append(f"{where} {type(attn).__name__} (the kernels run timm's Attention with a fused qkv)")
        return 0
    _attention_extras(attn, where, problems, "scale_attn_norm")
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
        if not is_identity(getattr(attn, part, None)):
            problems.append(f"{where}.{part} ({what} in differential attention)")
    if not isinstance(getattr(attn, "proj", None), nn.Linear):
        problems.append(f"{where}.proj {type(getattr(attn, 'proj', None)).__name__} (a Linear is expected)")
    head_dim, heads = int(attn.head_dim), int(attn.num_heads)
    if attn.qkv.out_features != 3 * heads * 2 * head_dim:
        problems.append(f"{where}.qkv gives {attn.qkv.out_features} features, not 3 x heads x 2 x head_dim")
    _lambda_and_sub_norm_problems(attn, where, problems)
    return 2 * head_dim


def _lambda_and_sub_norm_problems(attn, where: str, problems: list[str]) -> None:
    """What :func:`_diff_attention` reads of a ``DiffAttention`` or ``DiffParallelScalingBlock``: an affine RmsNorm
    ``sub_norm`` over ``2 * head_dim`` and timm's ``_compute_lambda``."""
    head_dim, kind = int(attn.head_dim), type(attn).__name__
    sub_norm = getattr(attn, "sub_norm", None)
    weight = getattr(sub_norm, "weight", None)
    if type(sub_norm).__name__ != "RmsNorm" or not isinstance(weight, torch.Tensor) or weight.shape != (2 * head_dim,):
        problems.append(f"{where}.sub_norm {type(sub_norm).__name__} (an affine RmsNorm over 2 x head_dim is expected)")
    if not callable(getattr(attn, "_compute_lambda", None)):
        problems.append(f"{where} {kind} without _compute_lambda (a timm version vit-fast does not know)")


def _mlp_plan(mlp, where: str, problems: list[str]) -> MlpPlan:
    name = type(mlp).__name__
    linears = ("fc1_g", "fc1_x", "fc2") if name == "SwiGLU" else ("fc1", "fc2")
    if name not in ("Mlp", "GluMlp", "SwiGLU") or not all(
        isinstance(getattr(mlp, f, None), nn.Linear) for f in linears
    ):
        problems.append(f"{where} {name} (the kernels run timm's Mlp, GluMlp and SwiGLU with Linear layers)")
        return MlpPlan("gelu")
    # an MLP's own norm before fc2 (timm's scale_mlp_norm; EVA-02's SwiGLU): a LayerNorm or RmsNorm, one launch
    _norm_problems(getattr(mlp, "norm", None), f"{where}.norm", problems, allow_identity=True)
    act = _activation(getattr(mlp, "act", None), where, problems)
    if name == "SwiGLU":  # fc1_g and fc1_x stacked into one GEMM (gate rows first): act(gate) * x in its epilogue
        return MlpPlan(act, gated=True, gate_last=False)
    if name == "GluMlp":
        if getattr(mlp, "chunk_dim", -1) != -1:
            problems.append(f"{where} GluMlp chunk_dim={mlp.chunk_dim}")
        return MlpPlan(act, gated=True, gate_last=bool(getattr(mlp, "gate_last", True)))
    return MlpPlan(act)


def _layer_scale_problems(ls, where: str, problems: list[str]) -> None:
    if not is_identity(ls) and not isinstance(getattr(ls, "gamma", None), torch.Tensor):
        problems.append(f"{where} {type(ls).__name__} (LayerScale with a gamma, or none)")


#: what a ParallelScalingBlock may hold (timm 1.0.31); any other submodule is refused by name
_PARALLEL_SCALING_PARTS = (
    "in_norm",
    "in_proj",
    "q_norm",
    "k_norm",
    "attn_drop",
    "mlp_drop",
    "mlp_act",
    "out_proj",
    "attn_out_proj",
    "mlp_out_proj",
    "ls",
    "drop_path",
)


def _scaling_norm_problems(norm, width: int, where: str, problems: list[str], allow_identity: bool = False) -> None:
    """A LayerNorm or timm RmsNorm over ``width`` features (or Identity where allowed); else a problem."""
    if allow_identity and is_identity(norm):
        return
    if not (isinstance(norm, nn.LayerNorm) or is_rms_norm(norm)):
        problems.append(f"{where} {type(norm).__name__} (the kernels run LayerNorm and timm's RmsNorm)")
    elif tuple(norm.normalized_shape) != (width,):
        problems.append(f"{where} normalises {tuple(norm.normalized_shape)}, not the last dim ({width},)")


def _parallel_scaling_plan(block: nn.Module, where: str, problems: list[str]) -> BlockPlan:
    """timm's ``ParallelScalingBlock``: in_norm, one in_proj for fc1 and qkv, qk-norm, two output projections (or one
    fused ``out_proj``), LayerScale. Dropout and drop-path act in training only, where the block's own forward runs (as
    an attention mask does: :func:`vit_fast.apply_vit_fast`). Also timm's ``DiffParallelScalingBlock`` (differential
    attention, one ``out_proj``): see docs/development.md, section "timm blocks on the kernels (`timm_blocks.py`)"."""
    kind = type(block).__name__
    diff = kind == "DiffParallelScalingBlock"
    parts = _PARALLEL_SCALING_PARTS + (("sub_norm",) if diff else ())
    for name, module in block.named_children():
        if name not in parts:
            problems.append(f"{where}.{name} {type(module).__name__} (not part of the {kind} vit-fast runs)")
    in_proj = getattr(block, "in_proj", None)
    if not isinstance(in_proj, nn.Linear):
        problems.append(f"{where}.in_proj {type(in_proj).__name__} (a Linear is expected)")
        return BlockPlan(kind, (), 0)
    width, heads, head_dim = in_proj.in_features, int(block.num_heads), int(block.head_dim)
    hidden = in_proj.out_features - 3 * width
    if diff:
        _lambda_and_sub_norm_problems(block, where, problems)
        if getattr(block, "out_proj", None) is None:
            problems.append(f"{where}.out_proj None (timm's DiffParallelScalingBlock has one out_proj)")
    if heads * head_dim * (2 if diff else 1) != width:
        per_head = f"2 x {head_dim}" if diff else str(head_dim)
        problems.append(f"{where} has {heads} heads of {per_head}, not D = {width} features")
    elif list(getattr(block, "in_split", [])) != [hidden, width, width, width]:
        problems.append(f"{where}.in_split {getattr(block, 'in_split', None)} (expected [hidden, D, D, D])")
    _scaling_norm_problems(getattr(block, "in_norm", None), width, f"{where}.in_norm", problems)
    for part in ("q_norm", "k_norm"):
        _scaling_norm_problems(getattr(block, part, None), head_dim, f"{where}.{part}", problems, allow_identity=True)
    if getattr(block, "mlp_bias", None) is not None and in_proj.bias is not None:
        problems.append(f"{where}.mlp_bias beside in_proj.bias (timm builds one or the other)")
    found: list[str] = []
    act = _activation(getattr(block, "mlp_act", None), where, found)
    problems += [p.replace(f"{where}.act ", f"{where}.mlp_act ", 1) for p in found]
    if getattr(block, "out_proj", None) is not None:
        if not isinstance(block.out_proj, nn.Linear) or block.out_proj.in_features != width + hidden:
            problems.append(f"{where}.out_proj {type(block.out_proj).__name__} (a Linear over D + hidden features)")
    elif not all(isinstance(getattr(block, p, None), nn.Linear) for p in ("attn_out_proj", "mlp_out_proj")):
        problems.append(f"{where}.attn_out_proj / mlp_out_proj (Linear layers are expected)")
    for part in ("attn_drop", "mlp_drop", "drop_path"):
        module = getattr(block, part, None)
        if not (is_identity(module) or type(module).__name__ in ("Dropout", "DropPath")):
            problems.append(f"{where}.{part} {type(module).__name__} (dropout or drop-path, training only)")
    _layer_scale_problems(getattr(block, "ls", None), f"{where}.ls", problems)
    return BlockPlan(kind, (MlpPlan(act),), 2 * head_dim if diff else head_dim)


def _eva_plan(block: nn.Module, where: str, problems: list[str]) -> BlockPlan:
    """timm's ``EvaBlock``: norm1, an ``EvaAttention`` or ``AttentionRope`` (fused qkv with or without q/v biases, or
    q/k/v Linears) whose rotary table comes with each forward, gamma_1 / gamma_2, norm2, an Mlp or GluMlp. qk-norm,
    a norm inside attention, a gate, grouped-query heads and SwiGLU MLPs are refused by name."""
    attn, at = block.attn, f"{where}.attn"
    _norm_problems(block.norm1, f"{where}.norm1", problems)
    _norm_problems(block.norm2, f"{where}.norm2", problems)
    mlp = _mlp_plan(block.mlp, f"{where}.mlp", problems)
    for part in ("gamma_1", "gamma_2"):
        if not isinstance(getattr(block, part, None), (torch.Tensor, type(None))):
            problems.append(f"{where}.{part} {type(getattr(block, part)).__name__} (a LayerScale tensor, or None)")
    if type(attn).__name__ not in _EVA_ATTENTIONS:
        problems.append(f"{at} {type(attn).__name__} (the kernels run timm's {' and '.join(_EVA_ATTENTIONS)})")
        return BlockPlan("EvaBlock", (mlp,), 0)
    _attention_extras(attn, at, problems, "scale_attn_inner, a norm inside attn", ": not yet on the kernels")
    heads, head_dim = int(attn.num_heads), int(attn.head_dim)
    if getattr(attn, "num_kv_heads", heads) != heads:
        problems.append(f"{at} num_kv_heads={attn.num_kv_heads} (grouped-query attention)")
    projections = (attn.qkv,) if getattr(attn, "qkv", None) is not None else (attn.q_proj, attn.k_proj, attn.v_proj)
    if not all(isinstance(p, nn.Linear) for p in projections) or not isinstance(getattr(attn, "proj", None), nn.Linear):
        problems.append(f"{at} without Linear qkv (or q/k/v) and proj layers")
    elif sum(p.out_features for p in projections) != 3 * heads * head_dim:
        problems.append(
            f"{at} q/k/v give {sum(p.out_features for p in projections)} features, not 3 x heads x head_dim"
        )
    layout = "half" if getattr(attn, "rotate_half", False) else "interleaved"
    return BlockPlan("EvaBlock", (mlp,), head_dim, layout, int(attn.num_prefix_tokens))


def _block_plan(block: nn.Module, where: str, problems: list[str]) -> BlockPlan:
    kind = type(block).__name__
    if kind == "EvaBlock":
        return _eva_plan(block, where, problems)
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
    if kind in ("ParallelScalingBlock", "DiffParallelScalingBlock"):
        return _parallel_scaling_plan(block, where, problems)
    problems.append(f"{where} {kind} (the kernels run timm's {', '.join(BLOCK_KINDS)})")
    return BlockPlan(kind, (), 0)


def timm_model_refusal(model: nn.Module) -> str | None:
    """Why :func:`vit_fast.apply_vit_fast` refuses this timm model as a whole, before reading any block (its class,
    or no blocks); None when its blocks are read."""
    name = type(model).__name__
    if name in _REFUSED_MODELS:
        return f"timm {name} uses {_REFUSED_MODELS[name]}, which vit-fast's kernels do not run"
    if name not in MODEL_CLASSES:
        return f"timm model class {name} is not one vit-fast patches ({', '.join(MODEL_CLASSES)})"
    if name in NAFLEX_CLASSES and naflex_refusal(model) is not None:
        return naflex_refusal(model)
    if not list(getattr(model, "blocks", None) or []):
        return f"timm {name} has no transformer blocks (model.blocks is empty)"
    return None


def read_timm_blocks(model: nn.Module) -> list[tuple[BlockPlan, list[str]]]:
    """Each block of a timm ViT (whose class :func:`timm_model_refusal` accepts) as the kernels would run it, and
    what of it they do not run (``blocks.N.part (why)``; empty: all of it). Refuses nothing: what
    :func:`plan_timm_model` and :func:`vit_fast.explain` read."""
    read = []
    for i, block in enumerate(model.blocks):
        found: list[str] = []
        read.append((_block_plan(block, f"blocks.{i}", found), found))
    return read


def plan_timm_model(model: nn.Module, backend: str) -> list[BlockPlan]:
    """One plan per block of a timm ViT, after checking all of them; a ValueError names every feature the kernels
    do not run (each at most once, with the first block that has it), and with ``backend="triton"`` a head dim
    the attention kernel does not take."""
    refusal = timm_model_refusal(model)
    if refusal is not None:
        raise ValueError(f"apply_vit_fast: {refusal}: run this model unpatched")
    name = type(model).__name__
    problems: list[str] = []
    plans = []
    for plan, found in read_timm_blocks(model):
        plans.append(plan)
        for problem in found:  # name each feature once: 'blocks.3.attn.q_norm' repeats 'blocks.0.attn.q_norm'
            if BLOCK_INDEX.sub("", problem) not in {BLOCK_INDEX.sub("", p) for p in problems}:
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


def read_attention_pool(model: nn.Module) -> tuple[PoolPlan, list[str]] | None:
    """A timm ViT's ``attn_pool`` as the attention-pool kernel would run it, and what of it the kernels do not run
    (empty: all of it); None for any head other than an ``AttentionPoolLatent`` (it keeps timm's code). Refuses
    nothing: what :func:`plan_attention_pool` and :func:`vit_fast.explain` read."""
    pool = getattr(model, "attn_pool", None)
    if type(pool).__name__ != "AttentionPoolLatent":
        return None
    from vit_fast.kernels.attention_pool import MAX_QUERIES

    where, problems = "attn_pool", []
    if getattr(pool, "pos_embed", None) is not None:
        problems.append(f"{where}.pos_embed (a position embedding added inside the pool)")
    for part in ("q_norm", "k_norm"):
        if not is_identity(getattr(pool, part, None)):
            problems.append(f"{where}.{part} (qk-norm)")
    if not (is_identity(pool.q) or isinstance(pool.q, nn.Linear)):
        problems.append(f"{where}.q {type(pool.q).__name__} (a Linear, or none)")
    if not isinstance(pool.kv, nn.Linear):
        problems.append(f"{where}.kv {type(pool.kv).__name__} (a Linear is expected)")
    if not (is_identity(pool.proj) or isinstance(pool.proj, nn.Linear)):
        problems.append(f"{where}.proj {type(pool.proj).__name__} (a Linear, or none)")
    if not 1 <= pool.latent_len <= MAX_QUERIES:
        problems.append(f"{where} latent_len {pool.latent_len} (the kernel takes 1..{MAX_QUERIES} latents)")
    mlp = None
    if pool.mlp is not None:
        _norm_problems(pool.norm, f"{where}.norm", problems, allow_identity=True)
        mlp = _mlp_plan(pool.mlp, f"{where}.mlp", problems)
    pool_type = pool.pool if pool.pool in ("token", "avg") else ""
    return PoolPlan(pool.num_heads, int(pool.head_dim), float(pool.scale), mlp, pool_type), problems


def plan_attention_pool(model: nn.Module, backend: str) -> PoolPlan | None:
    """The plan of a timm ViT's ``attn_pool`` when it is an ``AttentionPoolLatent`` (None for any other head, which
    keeps timm's code); a ValueError names each feature of it the kernels do not run (a pos_embed on the pool,
    qk-norm, more than 16 latents, a norm other than LayerNorm, ...), and with ``backend="triton"`` a head dim the
    attention-pool kernel does not take."""
    read = read_attention_pool(model)
    if read is None:
        return None
    plan, problems = read
    if problems:
        raise ValueError(
            f"apply_vit_fast: timm {type(model).__name__}'s attention-pool head uses features vit-fast's kernels do "
            f"not run: {'; '.join(problems)}. Run this model unpatched"
        )
    if backend == "triton" and not runtime.head_dim_supported(plan.head_dim):
        low, high = runtime.head_dim_range()
        raise ValueError(
            f"apply_vit_fast(backend='triton'): the attention-pool kernel takes head dims {low}..{high}, this "
            f"model's attn_pool has {plan.head_dim}: use backend='auto' (it keeps timm's head where ours cannot run)"
        )
    return plan
