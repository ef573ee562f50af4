"""The kernels as a forward calls them, and which of them a call runs (the dispatch). :class:`_Ops` adapts each
kernel to the modules a forward holds; :func:`ops_for` picks per call direct launches or the ``torch.library`` ops,
under the first-use safety net until the call's shapes are cleared; :func:`patched_ops` is what a patched timm or
transformers layer runs on; :func:`with_lengths` carries a padded batch's lengths. See docs/kernels.md, "Launches
per forward".
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
import triton
from torch import nn

from vit_fast.backend import first_use
from vit_fast.kernels import OPS
from vit_fast.kernels.attention import attention, attention_ref, launch_attention
from vit_fast.kernels.attention_pool import attention_pool, attention_pool_ref, launch_attention_pool
from vit_fast.kernels.autotune import config_mode, m_class
from vit_fast.kernels.diff_attention import diff_attention, diff_attention_ref, launch_diff_attention
from vit_fast.kernels.launches import eager_direct
from vit_fast.kernels.layer_norm import (
    add_layer_norm_ref,
    launch_layer_norm,
    launch_rms_norm,
    layer_norm,
    rms_norm,
    rms_norm_ref,
)
from vit_fast.kernels.linear import (
    launch_linear,
    layer_norm_linear,
    layer_norm_linear_ref,
    linear,
    linear_ref,
    rms_norm_linear,
    rms_norm_linear_ref,
)
from vit_fast.kernels.patch_embed import launch_patch_embed, patch_embed, patch_embed_ref
from vit_fast.kernels.rope import check_rope
from vit_fast.kernels.switches import switch


class _Ops:
    """The kernels as one forward calls them. ``direct``: plain eager inference (no autograd, not traced):
    each call goes straight to the kernel's launcher with its checks skipped, since the forward checked every
    parameter once (:func:`vit_fast.model.validation.check_kernel_params`); otherwise the public ``torch.library`` ops,
    each checking its inputs, which autograd, torch.compile and export see."""

    #: the kernels read a LayerScale's gamma tensor and an activation's name, never the modules themselves (as
    #: ``vit_fast.model.layers.TorchOps(modules=True)`` does); a class attribute: read per block, found at once
    modules = False

    def __init__(self, direct: bool) -> None:
        self.direct = direct

    def linear(self, x, lin: nn.Linear, act=None, residual=None, gamma=None) -> torch.Tensor:
        if self.direct:
            return launch_linear(x, lin.weight, lin.bias, act, residual, gamma, checked=True)
        return linear(x, lin.weight, lin.bias, activation=act, residual=residual, gamma=gamma)

    def norm_linear(self, norm: nn.LayerNorm, x, lin: nn.Linear, act) -> torch.Tensor:
        if self.direct:
            w, b = lin.weight, lin.bias
            return launch_linear(x, w, b, act, ln_weight=norm.weight, ln_bias=norm.bias, ln_eps=norm.eps, checked=True)
        return layer_norm_linear(x, norm.weight, norm.bias, norm.eps, lin.weight, lin.bias, act)

    def attention(
        self,
        qkv,
        num_heads: int,
        scale: float,
        lengths: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        rope: tuple | None = None,
    ) -> torch.Tensor:
        """``lengths [B]`` (int32): a padded batch's valid tokens per sample, a prefix of each row. ``cu_seqlens
        [N + 1]`` (int32): images packed along the tokens; ``max_seqlen`` its longest segment. ``rope``: ``(cos, sin,
        num_prefix, layout)``, q and k rotated in the kernel (see :func:`vit_fast.kernels.attention.attention`)."""
        masks = dict(lengths=lengths, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        if rope is not None:
            masks.update(zip(("rope_cos", "rope_sin", "num_prefix", "rope_layout"), rope, strict=True))
        if self.direct:
            if rope is not None:  # the tables come with each forward: their shapes checked here (no device read)
                check_rope(qkv, num_heads, *rope)
            return launch_attention(qkv, num_heads, scale, **masks, checked=True)
        return attention(qkv, num_heads, scale, **masks)

    def diff_attention(self, qkv, lambda_full, norm_weight, num_heads: int, lambda_init, scale, eps) -> torch.Tensor:
        args = (qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, eps)
        return launch_diff_attention(*args, checked=True) if self.direct else diff_attention(*args)

    def attention_pool(self, q, kv, num_heads: int, scale: float) -> torch.Tensor:
        """An attention-pool head's latent queries ``q [1 or B, L, D]`` against ``kv [B, T, 2D]``."""
        args = (q, kv, num_heads, scale)
        return launch_attention_pool(*args, checked=True) if self.direct else attention_pool(*args)

    def layer_norm(self, norm: nn.LayerNorm, x) -> torch.Tensor:
        if self.direct:
            return launch_layer_norm(x, norm.weight, norm.bias, norm.eps, checked=True)
        return layer_norm(x, norm.weight, norm.bias, norm.eps)

    def rms_norm(self, norm: nn.Module, x) -> torch.Tensor:
        """timm's ``RmsNorm`` / ``RmsNormFp32`` (weight or none, no bias) on the LayerNorm kernel's RMS mode."""
        if self.direct:
            return launch_rms_norm(x, norm.weight, None, norm.eps, checked=True)
        return rms_norm(x, norm.weight, None, norm.eps)

    def rms_norm_linear(self, norm: nn.Module, x, lin: nn.Linear, act) -> torch.Tensor:
        """``lin(RmsNorm(x))``: the GEMM with its norm prologue in RMS mode."""
        if self.direct:
            w, b = lin.weight, lin.bias
            return launch_linear(x, w, b, act, ln_weight=norm.weight, ln_eps=norm.eps, ln_rms=True, checked=True)
        return rms_norm_linear(x, norm.weight, None, norm.eps, lin.weight, lin.bias, act)

    def patch_embed(self, x, *args, **kwargs) -> torch.Tensor:
        return launch_patch_embed(x, *args, **kwargs, checked=True) if self.direct else patch_embed(x, *args, **kwargs)


def _layer_norm_ref(x, weight, bias, eps):
    return add_layer_norm_ref(x, None, weight, bias, eps)[1]


class _CheckedOps(_Ops):
    """The same ops under the first-use safety net (:mod:`vit_fast.backend.first_use`): a kernel's first output per
    (op, device, triton version, dtype, config, shape class) is judged against eager PyTorch and float64; an op that
    failed runs in eager PyTorch (its ``*_ref``) from then on. The config is the one the launch ran with, as the
    kernel's ResolvedLaunches recorded it for this thread: a tuned config picked later for a shape class checked
    with the heuristic one is judged in its turn."""

    def _run(self, op, dtype, shape_class, launch, reference, args, kwargs=None) -> torch.Tensor:
        kwargs = kwargs or {}
        if op in first_use.failed_ops():
            return reference(*args, **kwargs)
        out = launch()
        if not first_use.eligible(out):  # traced or captured (an op failed earlier brought us here): not judged now
            return out
        launches = OPS[op].kernel.launches
        config = launches.launched_config()
        key = (op, str(out.device), triton.__version__, dtype, config, shape_class)
        if first_use.is_checked(key) or first_use.check(
            key, op, launches.kernel, out, reference, args, kwargs, dtype, config=config
        ):
            return out
        return reference(*args, **kwargs)

    def linear(self, x, lin: nn.Linear, act=None, residual=None, gamma=None) -> torch.Tensor:
        shape = (
            m_class(x.numel() // x.shape[-1]),
            tuple(lin.weight.shape),
            act,
            *(t is not None for t in (lin.bias, residual, gamma)),
        )
        args = (x, lin.weight, lin.bias, act, residual, gamma)
        launch = lambda: _Ops.linear(self, x, lin, act, residual, gamma)  # noqa: E731
        return self._run("linear", x.dtype, shape, launch, linear_ref, args)

    def norm_linear(self, norm: nn.LayerNorm, x, lin: nn.Linear, act) -> torch.Tensor:
        shape = (m_class(x.numel() // x.shape[-1]), tuple(lin.weight.shape), act, lin.bias is not None)
        args = (x, norm.weight, norm.bias, norm.eps, lin.weight, lin.bias, act)
        launch = lambda: _Ops.norm_linear(self, norm, x, lin, act)  # noqa: E731
        return self._run("layer_norm_linear", x.dtype, shape, launch, layer_norm_linear_ref, args)

    def attention(
        self,
        qkv,
        num_heads: int,
        scale: float,
        lengths: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        rope: tuple | None = None,
    ) -> torch.Tensor:
        batch, tokens, width = qkv.shape
        masks = (lengths is not None, cu_seqlens is not None, None if rope is None else (rope[0].dim(), *rope[2:]))
        shape = (m_class(batch * tokens), tokens, num_heads, width // (3 * num_heads), *masks)
        launch = lambda: _Ops.attention(self, qkv, num_heads, scale, lengths, cu_seqlens, max_seqlen, rope)  # noqa: E731
        args, kwargs = (qkv, num_heads, scale), {"lengths": lengths, "cu_seqlens": cu_seqlens, "rope": rope}
        return self._run("attention", qkv.dtype, shape, launch, attention_ref, args, kwargs)

    def diff_attention(self, qkv, lambda_full, norm_weight, num_heads: int, lambda_init, scale, eps) -> torch.Tensor:
        batch, tokens, width = qkv.shape
        shape = (m_class(batch * tokens), tokens, num_heads, width // (6 * num_heads))
        args = (qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, eps)
        launch = lambda: _Ops.diff_attention(self, *args)  # noqa: E731
        return self._run("diff_attention", qkv.dtype, shape, launch, diff_attention_ref, args)

    def attention_pool(self, q, kv, num_heads: int, scale: float) -> torch.Tensor:
        batch, tokens, width = kv.shape
        shape = (m_class(batch), tokens, q.shape[0], q.shape[1], num_heads, width // (2 * num_heads))
        args = (q, kv, num_heads, scale)
        launch = lambda: _Ops.attention_pool(self, *args)  # noqa: E731
        return self._run("attention_pool", kv.dtype, shape, launch, attention_pool_ref, args)

    def layer_norm(self, norm: nn.LayerNorm, x) -> torch.Tensor:
        shape = (m_class(x.numel() // x.shape[-1]), x.shape[-1])
        launch = lambda: _Ops.layer_norm(self, norm, x)  # noqa: E731
        args = (x, norm.weight, norm.bias, norm.eps)
        return self._run("layer_norm", x.dtype, shape, launch, _layer_norm_ref, args)

    def rms_norm(self, norm: nn.Module, x) -> torch.Tensor:
        shape = (m_class(x.numel() // x.shape[-1]), x.shape[-1])
        launch = lambda: _Ops.rms_norm(self, norm, x)  # noqa: E731
        args = (x, norm.weight, None, norm.eps)
        return self._run("rms_norm", x.dtype, shape, launch, rms_norm_ref, args)

    def rms_norm_linear(self, norm: nn.Module, x, lin: nn.Linear, act) -> torch.Tensor:
        shape = (m_class(x.numel() // x.shape[-1]), tuple(lin.weight.shape), act, lin.bias is not None)
        args = (x, norm.weight, None, norm.eps, lin.weight, lin.bias, act)
        launch = lambda: _Ops.rms_norm_linear(self, norm, x, lin, act)  # noqa: E731
        return self._run("rms_norm_linear", x.dtype, shape, launch, rms_norm_linear_ref, args)

    def patch_embed(self, x, *args, **kwargs) -> torch.Tensor:
        weight = args[0]
        shape = (m_class(x.shape[0]), tuple(x.shape[1:]), str(x.dtype), tuple(weight.shape))
        launch = lambda: _Ops.patch_embed(self, x, *args, **kwargs)  # noqa: E731
        return self._run("patch_embed", weight.dtype, shape, launch, patch_embed_ref, (x, *args), kwargs)


_DIRECT, _THROUGH_OPS = _Ops(direct=True), _Ops(direct=False)
_CHECKED_DIRECT, _CHECKED_THROUGH = _CheckedOps(direct=True), _CheckedOps(direct=False)

#: per model, the forwards (input shape, dtype, device, LayerNorm folding, config mode) whose every op passed its
#: first-use check
_CLEARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _forward_key(owner: nn.Module, x: torch.Tensor, shape: tuple | None = None) -> tuple:
    """What a cleared forward is known by: its input and everything else that decides which kernels and configs it
    launches (``kernels.autotune.config_mode``: tuning on or off, the TMA switch). A forward cleared with the
    heuristic configs is not cleared for the tuned ones: its first tuned run goes through the net again. ``shape``:
    what stands for x's shape where one tensor does not say it (a packed forward: every image's shape)."""
    return shape or x.shape, x.dtype, x.device, layer_norm_fused(owner), config_mode()


def ops_for(owner: nn.Module, x: torch.Tensor, shape: tuple | None = None) -> _Ops:
    """The ops a forward of ``owner`` (the module whose parameters it reads) on input ``x`` runs: direct launches
    (``ops.direct``; the caller checks the parameters once, the launches do not) for plain eager inference; else the
    custom ops (direct launches bypass autograd, and tracing must see the ops). Under the first-use safety net
    until this forward's shapes have all been checked (then one lookup per forward); the custom ops under it
    wherever it may check (:func:`vit_fast.backend.first_use.eligible`: eager with autograd on) or an op failed it."""
    if torch.is_grad_enabled() or not eager_direct(x):
        return patched_ops(x)
    if not first_use.enabled():
        return _DIRECT
    if not first_use.failed_ops() and _forward_key(owner, x, shape) in _CLEARED.get(owner, ()):
        return _DIRECT
    return _CHECKED_DIRECT if first_use.eligible(x) else _DIRECT


def forward_done(owner: nn.Module, x: torch.Tensor, ops: _Ops, shape: tuple | None = None) -> None:
    """After a forward under the safety net: its shapes are checked, later forwards of them skip the net."""
    if ops is _CHECKED_DIRECT and not first_use.failed_ops():
        _CLEARED.setdefault(owner, set()).add(_forward_key(owner, x, shape))


def patched_ops(x: torch.Tensor, lengths: torch.Tensor | None = None):
    """The custom ops (what autograd, torch.compile and export see) for input ``x``, under the first-use safety net
    in eager calls; with ``lengths`` for a padded batch (:func:`with_lengths`). What a patched timm or transformers
    layer runs on."""
    return with_lengths(_CHECKED_THROUGH if first_use.applies(x) else _THROUGH_OPS, lengths)


def fuse_ln_from_env() -> bool:
    """``VIT_FAST_FUSE_LN``: on unless set off (0, false, no, off); another value raises ValueError naming it."""
    return bool(switch("VIT_FAST_FUSE_LN", True))


def layer_norm_fused(owner: nn.Module) -> bool:
    """LayerNorm folded into the next GEMM (the default), unless the model (``fuse_layer_norm``) or
    ``VIT_FAST_FUSE_LN=0`` says not."""
    return getattr(owner, "fuse_layer_norm", True) and fuse_ln_from_env()


# --------------------------------------------------------------------------- key padding (native resolution)
def attention_with_lengths(
    ops: _Ops, qkv: torch.Tensor, num_heads: int, scale: float, lengths: torch.Tensor, rope=None
):
    """Self-attention of a padded batch, ``qkv [B, T, 3 * H * Dh]`` -> ``[B, T, H * Dh]``: every masked attention
    of a patched layer (timm's NaFlexVit, transformers' SigLIP 2) comes here, to the attention kernel with its
    ``lengths``. ``lengths [B]`` (int32, on qkv's device): sample b's tokens ``[0, lengths[b])`` are its keys and
    queries; the rest is padding, never read (even NaN there reaches no valid row), its output rows zeros."""
    return ops.attention(qkv, num_heads, scale, lengths, rope=rope)


def _key_padding(k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> tuple:
    """``k``, ``v`` ``[B, H, T, Dh]`` with padding keys zeroed (NaN there would survive a -inf mask in the sum),
    and the boolean key mask ``[B, 1, 1, T]`` (True: attend)."""
    valid = torch.arange(k.shape[2], device=k.device) < lengths.to(k.device)[:, None]
    keep = valid[:, None, :, None]
    return k.masked_fill(~keep, 0), v.masked_fill(~keep, 0), valid[:, None, None, :]


def attention_pool_with_lengths(ops: _Ops, q, kv, num_heads: int, scale: float, lengths: torch.Tensor):
    """An attention-pool head's latent queries ``q [1 or B, L, D]`` against the valid keys of ``kv [B, T, 2D]``
    (``lengths`` as for :func:`attention_with_lengths`) -> ``[B, L, D]``: the attention-pool kernel when nothing is
    padded, else PyTorch (the pool kernel takes no lengths)."""
    batch, tokens, width = kv.shape
    if int(lengths.min()) == tokens:
        return ops.attention_pool(q, kv, num_heads, scale)
    dim = width // 2
    head_dim = dim // num_heads
    k, v = kv.reshape(batch, tokens, 2, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    k, v, mask = _key_padding(k, v, lengths)
    latents = q.shape[1]
    queries = q.reshape(q.shape[0], latents, num_heads, head_dim).transpose(1, 2).expand(batch, -1, -1, -1)
    out = F.scaled_dot_product_attention(queries, k, v, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).reshape(batch, latents, dim)


class _WithLengths:
    """``ops`` whose attention and attention pool see only each sample's first ``lengths[b]`` keys; every other op
    is ``ops``' own."""

    def __init__(self, ops: _Ops, lengths: torch.Tensor) -> None:
        self.ops, self.lengths = ops, lengths

    def __getattr__(self, name: str):
        return getattr(self.ops, name)

    def attention(self, qkv, num_heads: int, scale: float, rope: tuple | None = None) -> torch.Tensor:
        return attention_with_lengths(self.ops, qkv, num_heads, scale, self.lengths, rope)

    def attention_pool(self, q, kv, num_heads: int, scale: float) -> torch.Tensor:
        return attention_pool_with_lengths(self.ops, q, kv, num_heads, scale, self.lengths)

    def diff_attention(self, *args) -> torch.Tensor:
        raise TypeError("differential attention takes no key-padding lengths (its layers run their own forward)")


def with_lengths(ops: _Ops, lengths: torch.Tensor | None):
    """``ops`` for a padded batch (see :class:`_WithLengths`); ``ops`` itself when ``lengths`` is None."""
    return ops if lengths is None else _WithLengths(ops, lengths)


__all__ = ["fuse_ln_from_env", "layer_norm_fused", "ops_for", "forward_done", "patched_ops", "with_lengths"]
