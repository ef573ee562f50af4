"""The kernels as a forward calls them, and which of them a call runs (the dispatch). :class:`_Ops` adapts each
kernel to the modules a forward holds; :func:`ops_for` picks per forward whether its calls check their inputs and
whether the first-use safety net judges them; :func:`patched_ops` is what a patched timm or transformers layer runs
on; :func:`with_lengths` carries a padded batch's lengths. See docs/kernels.md, "Launches per forward".
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
from torch import nn

from vit_fast.backend import first_use
from vit_fast.backend.ops import OP_NAMES, AttentionMasks, ForwardingOps, Ops
from vit_fast.base.switches import switch
from vit_fast.kernels import OPS
from vit_fast.kernels.attention import attention_ref
from vit_fast.kernels.attention_pool import attention_pool_ref
from vit_fast.kernels.autotune import config_mode, m_class
from vit_fast.kernels.diff_attention import diff_attention_ref
from vit_fast.kernels.launches import forward_launches_directly
from vit_fast.kernels.layer_norm import add_layer_norm_ref, rms_norm_ref
from vit_fast.kernels.linear import layer_norm_linear_ref, linear_ref, rms_norm_linear_ref
from vit_fast.kernels.patch_embed import patch_embed_ref
from vit_fast.kernels.rope import check_rope

_NO_ROPE = (None, None, 0, "interleaved")  # the attention op's rope_cos, rope_sin, num_prefix, rope_layout


class _Ops(Ops):
    """The kernels as one forward calls them (the :class:`~vit_fast.backend.ops.Ops` interface). ``params_checked``:
    the forward checked every parameter once (:func:`vit_fast.model.validation.check_kernel_params`, in plain eager),
    so the calls skip their input checks; otherwise each call checks its inputs. ``direct``: the forward asked
    ``kernels.launches.forward_launches_directly`` once and every op is its launcher; otherwise each op is its kernel
    op's call, which asks per call. Which: :func:`ops_for` and :func:`patched_ops`, nowhere else in vit_fast."""

    def __init__(self, params_checked: bool, direct: bool = False) -> None:
        if direct and not params_checked:
            raise ValueError("a forward launches directly only with its parameters checked once")
        self.params_checked, self.direct = params_checked, direct
        for name, judged in _CHECKS.items():  # each interface op's kernel op: ``_<op>``, its call or its launcher
            call = OPS[judged.op].spec
            if direct:
                call = call.direct
            elif params_checked:
                call = functools.partial(call, checked=True)
            setattr(self, f"_{name}", call)

    def linear(self, x, lin: nn.Module, act=None, residual=None, gamma=None) -> torch.Tensor:
        return self._linear(x, lin.weight, lin.bias, act, residual, gamma)

    def norm_linear(self, norm: nn.LayerNorm, x, lin: nn.Module, act) -> torch.Tensor:
        args = (x, norm.weight, norm.bias, norm.eps, lin.weight, lin.bias, act)
        return self._norm_linear(*args)

    def rms_norm_linear(self, norm: nn.Module, x, lin: nn.Module, act) -> torch.Tensor:
        args = (x, norm.weight, None, norm.eps, lin.weight, lin.bias, act)
        return self._rms_norm_linear(*args)

    def layer_norm(self, norm: nn.LayerNorm, x) -> torch.Tensor:
        return self._layer_norm(x, norm.weight, norm.bias, norm.eps)

    def rms_norm(self, norm: nn.Module, x) -> torch.Tensor:
        return self._rms_norm(x, norm.weight, None, norm.eps)

    def attend(self, qkv, num_heads: int, scale: float, masks: AttentionMasks) -> torch.Tensor:
        """``masks.rope``: ``(cos, sin, num_prefix, layout)``, q and k rotated in the kernel; ``masks.first_token``:
        every query runs, token 0's row is returned (the kernel has no single-query mode)."""
        lengths, cu_seqlens, max_seqlen, rope, first_token = masks
        if rope is None:
            rope = _NO_ROPE
        elif self.params_checked:  # the tables come with each forward: their shapes checked here (no device read)
            check_rope(qkv, num_heads, *rope)
        out = self._attend(qkv, num_heads, scale, lengths, cu_seqlens, max_seqlen, *rope)
        return out[:, :1] if first_token else out

    def diff_attention(self, qkv, lambda_full, norm_weight, num_heads: int, lambda_init, scale, eps) -> torch.Tensor:
        return self._diff_attention(qkv, lambda_full, norm_weight, num_heads, lambda_init, scale, eps)

    def attention_pool(self, q, kv, num_heads: int, scale: float) -> torch.Tensor:
        return self._attention_pool(q, kv, num_heads, scale)

    def patch_embed(
        self, x, weight, bias, pos_embed, cls_token=None, reg_token=None, *, no_embed_class=False, mean=None, std=None
    ) -> torch.Tensor:
        args = (x, weight, bias, pos_embed, cls_token, reg_token, mean, std, no_embed_class)
        return self._patch_embed(*args)


def _layer_norm_ref(x, weight, bias, eps):
    return add_layer_norm_ref(x, None, weight, bias, eps)[1]


def _first_token_ref(*args, **kwargs) -> torch.Tensor:
    return attention_ref(*args, **kwargs)[:, :1]


def _rows(x: torch.Tensor) -> int:
    return m_class(x.numel() // x.shape[-1])


class _Check(NamedTuple):
    """How the first-use net judges one op: the kernel op (``OPS`` name) it launches, and two functions taking the
    op's own arguments: ``shape`` gives ``(dtype, shape class)``, ``reference`` gives ``(eager, args, kwargs)``."""

    op: str
    shape: Callable
    reference: Callable


def _attention_shape(qkv, num_heads, scale, masks: AttentionMasks):
    batch, tokens, width = qkv.shape
    rope = masks.rope
    rope_class = None if rope is None else (rope[0].dim(), *rope[2:])
    mask_class = (rope_class, masks.first_token, masks.lengths is not None, masks.cu_seqlens is not None)
    return qkv.dtype, (m_class(batch * tokens), tokens, num_heads, width // (3 * num_heads), *mask_class)


def _attention_ref(qkv, num_heads, scale, masks: AttentionMasks):
    kwargs = {"lengths": masks.lengths, "cu_seqlens": masks.cu_seqlens, "rope": masks.rope}
    return (_first_token_ref if masks.first_token else attention_ref), (qkv, num_heads, scale), kwargs


def _patch_embed_shape(x, weight, *args, **kwargs):
    return weight.dtype, (m_class(x.shape[0]), tuple(x.shape[1:]), str(x.dtype), tuple(weight.shape))


#: each op of the interface: the kernel op :class:`_Ops` calls for it (as ``_<op>``) and how the first-use net judges
#: it (one entry per op; the wrapper is generic)
_CHECKS = {
    "linear": _Check(
        "linear",
        lambda x, lin, act=None, residual=None, gamma=None: (
            x.dtype,
            (_rows(x), tuple(lin.weight.shape), act, *(t is not None for t in (lin.bias, residual, gamma))),
        ),
        lambda x, lin, act=None, residual=None, gamma=None: (
            linear_ref,
            (x, lin.weight, lin.bias, act, residual, gamma),
            {},
        ),
    ),
    "norm_linear": _Check(
        "layer_norm_linear",
        lambda norm, x, lin, act: (x.dtype, (_rows(x), tuple(lin.weight.shape), act, lin.bias is not None)),
        lambda norm, x, lin, act: (
            layer_norm_linear_ref,
            (x, norm.weight, norm.bias, norm.eps, lin.weight, lin.bias, act),
            {},
        ),
    ),
    "rms_norm_linear": _Check(
        "rms_norm_linear",
        lambda norm, x, lin, act: (x.dtype, (_rows(x), tuple(lin.weight.shape), act, lin.bias is not None)),
        lambda norm, x, lin, act: (
            rms_norm_linear_ref,
            (x, norm.weight, None, norm.eps, lin.weight, lin.bias, act),
            {},
        ),
    ),
    "layer_norm": _Check(
        "layer_norm",
        lambda norm, x: (x.dtype, (_rows(x), x.shape[-1])),
        lambda norm, x: (_layer_norm_ref, (x, norm.weight, norm.bias, norm.eps), {}),
    ),
    "rms_norm": _Check(
        "rms_norm",
        lambda norm, x: (x.dtype, (_rows(x), x.shape[-1])),
        lambda norm, x: (rms_norm_ref, (x, norm.weight, None, norm.eps), {}),
    ),
    "attend": _Check("attention", _attention_shape, _attention_ref),
    "diff_attention": _Check(
        "diff_attention",
        lambda qkv, lambda_full, norm_weight, num_heads, *rest: (
            qkv.dtype,
            (m_class(qkv.shape[0] * qkv.shape[1]), qkv.shape[1], num_heads, qkv.shape[2] // (6 * num_heads)),
        ),
        lambda *args: (diff_attention_ref, args, {}),
    ),
    "attention_pool": _Check(
        "attention_pool",
        lambda q, kv, num_heads, scale: (
            kv.dtype,
            (m_class(kv.shape[0]), kv.shape[1], q.shape[0], q.shape[1], num_heads, kv.shape[2] // (2 * num_heads)),
        ),
        lambda *args: (attention_pool_ref, args, {}),
    ),
    "patch_embed": _Check("patch_embed", _patch_embed_shape, lambda *args, **kwargs: (patch_embed_ref, args, kwargs)),
}


def _judged(method: Callable, check: _Check) -> Callable:
    """``method`` of :class:`_Ops` under the first-use net: a kernel's first output per (op, device, triton version,
    dtype, config, shape class) is judged against eager PyTorch and float64; an op that failed runs in eager PyTorch
    (its ``*_ref``) from then on. The config is the one the launch ran with, as the kernel's ResolvedLaunches
    recorded it for this thread: a tuned config picked later for a shape class checked with the heuristic one is
    judged in its turn."""

    @functools.wraps(method)
    def judged(self, *args, **kwargs) -> torch.Tensor:
        if check.op in first_use.failed_ops():
            reference, ref_args, ref_kwargs = check.reference(*args, **kwargs)
            return reference(*ref_args, **ref_kwargs)
        out = method(self, *args, **kwargs)
        if not first_use.eligible(out):  # traced or captured (an op failed earlier brought us here): not judged now
            return out
        launches = OPS[check.op].kernel.launches
        config = launches.launched_config()
        dtype, shape_class = check.shape(*args, **kwargs)
        key = (check.op, str(out.device), triton.__version__, dtype, config, shape_class)
        if first_use.is_checked(key):
            return out
        reference, ref_args, ref_kwargs = check.reference(*args, **kwargs)
        if first_use.check(key, check.op, launches.kernel, out, reference, ref_args, ref_kwargs, dtype, config=config):
            return out
        return reference(*ref_args, **ref_kwargs)

    return judged


class _CheckedOps(_Ops):
    """:class:`_Ops` under the first-use safety net (:mod:`vit_fast.backend.first_use`), every op through
    :func:`_judged` with its entry in ``_CHECKS``."""


for _name in OP_NAMES:
    setattr(_CheckedOps, _name, _judged(getattr(_Ops, _name), _CHECKS[_name]))


#: a model's forward (its parameters checked once), by whether it launches directly, and a patched layer's (each call
#: checks its inputs); either under the first-use net
_FORWARD = {direct: _Ops(params_checked=True, direct=direct) for direct in (False, True)}
_FORWARD_NET = {direct: _CheckedOps(params_checked=True, direct=direct) for direct in (False, True)}
_PER_CALL, _PER_CALL_NET = _Ops(params_checked=False), _CheckedOps(params_checked=False)

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
    """The ops a forward of ``owner`` (the module whose parameters it reads) on input ``x`` runs. In eager (autograd
    on or off) their calls skip the input checks (``ops.params_checked``: the caller checks the parameters once);
    traced or captured, each call checks its inputs, as a patched layer's do. Direct launch or custom op: asked once
    for the forward (``kernels.launches.forward_launches_directly``), else per call. Under the first-use safety net
    until this forward's shapes have all been checked (then one lookup per forward)."""
    if not first_use.eligible(x):  # traced, or captured into a CUDA graph
        return patched_ops(x)
    direct = forward_launches_directly(x)
    if not first_use.enabled():
        return _FORWARD[direct]
    if not first_use.failed_ops() and _forward_key(owner, x, shape) in _CLEARED.get(owner, ()):
        return _FORWARD[direct]
    return (_FORWARD_NET if first_use.applies(x) else _FORWARD)[direct]


def choice_state(x: torch.Tensor) -> tuple:
    """What :func:`ops_for` and :func:`layer_norm_fused` read besides the model and ``x``'s shape, dtype and device,
    read now: a forward planned in the same state, on a :func:`settled` choice, gets the same ops and fusion."""
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    dispatch = torch._C._len_torch_dispatch_stack()
    grad = torch.is_grad_enabled()
    flags = (config_mode(), first_use.enabled(), first_use.failed_ops(), fuse_ln_from_env())
    return grad, x.requires_grad, type(x), dispatch, capturing, *flags


def settled(ops: _Ops) -> bool:
    """Whether :func:`ops_for` picks ``ops`` again in the same state: all but a forward that may clear the first-use
    net (:func:`forward_done`), after which its shapes run without it."""
    return ops not in _FORWARD_NET.values()


def forward_done(owner: nn.Module, x: torch.Tensor, ops: _Ops, shape: tuple | None = None) -> None:
    """After a forward under the safety net: its shapes are checked, later forwards of them skip the net."""
    if not settled(ops) and not first_use.failed_ops():
        _CLEARED.setdefault(owner, set()).add(_forward_key(owner, x, shape))


def patched_ops(x: torch.Tensor, lengths: torch.Tensor | None = None):
    """The ops whose calls check their inputs, for input ``x`` (what a patched timm or transformers layer runs on,
    and a traced forward), under the first-use safety net in eager calls; with ``lengths`` for a padded batch
    (:func:`with_lengths`)."""
    return with_lengths(_PER_CALL_NET if first_use.applies(x) else _PER_CALL, lengths)


def fuse_ln_from_env() -> bool:
    """``VIT_FAST_FUSE_LN``: on unless set off (0, false, no, off); another value raises ValueError naming it."""
    return bool(switch("VIT_FAST_FUSE_LN", True))


def layer_norm_fused(owner: nn.Module) -> bool:
    """LayerNorm folded into the next GEMM (the default), unless the model (``fuse_layer_norm``) or
    ``VIT_FAST_FUSE_LN=0`` says not."""
    return getattr(owner, "fuse_layer_norm", True) and fuse_ln_from_env()


# --------------------------------------------------------------------------- key padding (native resolution)
def attention_with_lengths(ops: Ops, qkv: torch.Tensor, num_heads: int, scale: float, lengths: torch.Tensor, rope=None):
    """Self-attention of a padded batch, ``qkv [B, T, 3 * H * Dh]`` -> ``[B, T, H * Dh]``: every masked attention
    of a patched layer (timm's NaFlexVit, transformers' SigLIP 2) comes here, to the attention kernel with its
    ``lengths``. ``lengths [B]`` (int32, on qkv's device): sample b's tokens ``[0, lengths[b])`` are its keys and
    queries; the rest is padding, never read (even NaN there reaches no valid row), its output rows zeros."""
    return ops.attend(qkv, num_heads, scale, AttentionMasks(lengths, rope=rope))


def _key_padding(k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> tuple:
    """``k``, ``v`` ``[B, H, T, Dh]`` with padding keys zeroed (NaN there would survive a -inf mask in the sum),
    and the boolean key mask ``[B, 1, 1, T]`` (True: attend)."""
    valid = torch.arange(k.shape[2], device=k.device) < lengths.to(k.device)[:, None]
    keep = valid[:, None, :, None]
    return k.masked_fill(~keep, 0), v.masked_fill(~keep, 0), valid[:, None, None, :]


def attention_pool_with_lengths(ops: Ops, q, kv, num_heads: int, scale: float, lengths: torch.Tensor):
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


class _WithLengths(ForwardingOps):
    """``ops`` whose attention and attention pool see only each sample's first ``lengths[b]`` keys; every other op
    is ``ops``' own."""

    def __init__(self, ops: Ops, lengths: torch.Tensor) -> None:
        super().__init__(ops)
        self.lengths = lengths

    def attend(self, qkv, num_heads: int, scale: float, masks: AttentionMasks) -> torch.Tensor:
        if masks.lengths is not None or masks.cu_seqlens is not None:
            raise TypeError("a padded batch's attention takes its lengths from the batch, no other mask")
        out = attention_with_lengths(self.ops, qkv, num_heads, scale, self.lengths, masks.rope)
        return out[:, :1] if masks.first_token else out

    def attention_pool(self, q, kv, num_heads: int, scale: float) -> torch.Tensor:
        return attention_pool_with_lengths(self.ops, q, kv, num_heads, scale, self.lengths)

    def diff_attention(self, qkv, lambda_full, norm_weight, num_heads: int, lambda_init, scale, eps) -> torch.Tensor:
        raise TypeError("differential attention takes no key-padding lengths (its layers run their own forward)")


def with_lengths(ops: Ops, lengths: torch.Tensor | None):
    """``ops`` for a padded batch (see :class:`_WithLengths`); ``ops`` itself when ``lengths`` is None."""
    return ops if lengths is None else _WithLengths(ops, lengths)


__all__ = ["choice_state", "fuse_ln_from_env", "forward_done", "layer_norm_fused", "ops_for", "patched_ops", "settled"]
__all__ += ["with_lengths"]
