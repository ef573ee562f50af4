"""What a kernel file's launcher and op wrapper are written with: host arithmetic for grids, the kernels' flags for
bf16 under the interpreter, the output buffer and device checks, Triton's scratch allocator, and the backward that
recomputes through the eager reference, the references' upcast, and :func:`define_op`, which makes an op of a launch. Private to the kernel
files; importing it touches no GPU driver."""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.runtime import _allocation

from vit_fast.base.interpret import interpreter_enabled

from .launches import INTERPRETED, launches_directly


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launchers and grids: ``triton.cdiv`` is a ConstexprFunction, 1.6 µs a call on the host."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` >= 1, as ``triton.next_power_of_2`` gives it, at host speed."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def _torch_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")  # the caching allocator: 512-byte aligned


def ensure_scratch_allocator() -> None:
    """Give Triton an allocator for kernels' scratch memory (where device-side TMA descriptors live) unless one is
    set: Triton keeps it per thread (a ContextVar), so a launcher calls this before each launch that may need it
    (about 0.2 µs). A user's own ``triton.set_allocator`` is left alone."""
    if INTERPRETED:
        return
    current = getattr(_allocation, "_allocator", None)
    if current is None or isinstance(current.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)


#: ``interpret_bf16(dtype)``: bf16 under the interpreter, the kernels' ``ROUND_BF16`` flag (bf16 stores rounded by
#: hand); a dict lookup, not a Python call: every launch asks, and the per-call choice of direct launch or op costs
#: about as much as the three calls these two flags were
interpret_bf16: Callable[[torch.dtype], bool] = defaultdict(bool, {torch.bfloat16: INTERPRETED}).__getitem__

#: ``dot_in_fp32(dtype)``: the kernels' ``DOT_IN_FP32`` flag (see :func:`._tl.dot`): fp32 inputs, or bf16 under the
#: interpreter
dot_in_fp32: Callable[[torch.dtype], bool] = defaultdict(
    bool, {torch.float32: True, torch.bfloat16: INTERPRETED}
).__getitem__


def upcast_16bit(upcast: bool, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The eager references' ``upcast``: ``tensors`` in float32 when ``upcast`` and the first is float16 / bfloat16,
    else as they are (float32 and float64 compute as given); None stays None."""
    if not (upcast and tensors[0].dtype in (torch.float16, torch.bfloat16)):
        return tensors
    return tuple(t.float() if t is not None else None for t in tensors)


# ---------------------------------------------------------------------------------- checks


def output_buffer(op: str, out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A launcher's output: ``out`` when it is ``shape`` in ``like``'s dtype and device with a contiguous last dim
    (a ValueError naming ``op`` and what differs otherwise), or a new tensor when ``out`` is None."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if tuple(out.shape) != shape or out.dtype != like.dtype or out.device != like.device or out.stride(-1) != 1:
        raise ValueError(
            f"{op}: out must be [{', '.join(map(str, shape))}] {like.dtype} on {like.device} with a contiguous last "
            f"dim, got {tuple(out.shape)} {out.dtype} on {out.device} stride {tuple(out.stride())}"
        )
    return out


def check_device(what: str, tensor: torch.Tensor) -> None:
    """Raise before launch unless ``tensor`` can reach a kernel: CUDA, or CPU under the interpreter.
    Meta tensors pass: fake implementations run the same checks as the launchers."""
    if tensor.is_cuda or tensor.is_meta:
        return
    if tensor.device.type == "cpu":
        if interpreter_enabled():
            return
        raise RuntimeError(
            f"{what}: got a CPU tensor, but Triton kernels need a CUDA tensor on a CUDA GPU: move the inputs with "
            ".cuda(), or set TRITON_INTERPRET=1 before triton is imported to run the kernels in the (slow) CPU "
            "interpreter"
        )
    raise RuntimeError(f"{what}: tensors on {tensor.device} are not supported; the Triton kernels run on CUDA")


# ---------------------------------------------------------------------------------- autograd
def register_recompute_backward(op: torch.library.CustomOpDef, reference: Callable) -> None:
    """Give ``op`` a backward that recomputes its forward through the eager ``reference``, autograd on, and
    differentiates that: exact (eager's own backward, in the precision ``reference`` computes in) but not fused, so
    it costs one eager forward and backward per call. ``reference`` takes the op's arguments and returns its
    output(s), both in the op's order. Tensor inputs that need a gradient and are floating point get one (a uint8
    image does not); every other argument gets None."""

    def setup_context(ctx, inputs, output) -> None:
        ctx.tensor_positions = [i for i, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        ctx.others = {i: v for i, v in enumerate(inputs) if not isinstance(v, torch.Tensor)}
        ctx.save_for_backward(*(inputs[i] for i in ctx.tensor_positions))

    def backward(ctx, *grads):
        args = dict(ctx.others)
        for i, t in zip(ctx.tensor_positions, ctx.saved_tensors, strict=True):
            args[i] = t.detach().requires_grad_(bool(ctx.needs_input_grad[i]) and t.is_floating_point())
        args = [args[i] for i in range(len(args))]
        wanted = [i for i in ctx.tensor_positions if args[i].requires_grad]
        result = [None] * len(args)
        if not wanted:
            return tuple(result)
        with torch.enable_grad():
            outs = reference(*args)
            outs = outs if isinstance(outs, tuple) else (outs,)
            pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o.requires_grad]
            if pairs:
                got = torch.autograd.grad(
                    [o for o, _ in pairs], [args[i] for i in wanted], [g for _, g in pairs], allow_unused=True
                )
                for i, g in zip(wanted, got, strict=True):
                    result[i] = g
        return tuple(result)

    op.register_autograd(backward, setup_context=setup_context)


@dataclass(frozen=True)
class SelfCheck:
    """An op at a model's shapes in ``vit_fast.model.selfcheck``: ``cases(m)`` -> its launches ``(role, d)`` in one
    forward of a model of sizes ``m``; ``inputs(d, rnd, gen, device, dtype)`` -> ``(args, kwargs)`` for its launcher
    and reference (``rnd(*shape, scale=1.0)``: random in ``dtype`` on ``device``); ``launch(d, args, kwargs,
    poisoned)``: the launcher into outputs ``poisoned(*shape)`` makes; ``judged``; ``shape(d)``: a report's line."""

    cases: Callable[[dict], list[tuple[str, dict]]]
    inputs: Callable[..., tuple[tuple, dict]]
    launch: Callable[..., Any]
    shape: Callable[[dict], str]
    judged: Callable[[Any], Any] = lambda out: out


def case_rows(m: dict) -> dict:
    """A self-check case's token rows at a model's sizes ``m``: ``batch``, ``tokens``, width ``dim``, norm ``eps``."""
    return {key: m[key] for key in ("batch", "tokens", "dim", "eps")}


def define_op(
    launch: Callable[..., Any],
    *,
    check: Callable[..., None],
    empty: Callable[..., Any],
    reference: Callable[..., Any],
    prepare: Callable[..., tuple] | None = None,
    lead: int | None = None,
    selfcheck: SelfCheck | None = None,
) -> Callable[..., Any]:
    """Make ``launch`` (``_<name>_op``, typed: ``torch.library`` reads the schema from it) the custom op
    ``vit_fast::<name>``, the one place a kernel's op is written: fake = ``check`` + ``empty``'s outputs, backward
    recomputes through ``reference``. Returns the call every caller makes: ``check`` (skipped with ``checked=True``),
    ``prepare``, then ``launch`` or the op (its ``op`` attribute) as :func:`.launches.launches_directly` says; it
    carries the spec (``selfcheck``: :class:`SelfCheck`). More: docs/kernels.md, "Ops, launchers and references"."""
    name = launch.__name__.removeprefix("_").removesuffix("_op")
    op = torch.library.custom_op(f"vit_fast::{name}", mutates_args=())(launch)

    signature = inspect.signature(launch)

    def fake(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)  # every argument, in order: defaults filled
        bound.apply_defaults()
        check(*bound.args)
        return empty(*bound.args)

    op.register_fake(fake)
    register_recompute_backward(op, reference)
    parameters = signature.parameters.values()
    tensors = tuple(i for i, p in enumerate(parameters) if "Tensor" in str(p.annotation))
    first = tensors[0] if lead is None else lead
    rest = tuple(i for i in tensors if i != first)

    def call(*args: Any, checked: bool = False) -> Any:
        # checked=True: the caller checked these inputs (a model's forward checks its parameters once)
        if not checked:
            check(*args)
        if prepare is not None:
            args = prepare(*args)
        # direct launch or custom op: launches.launches_directly, asked of ``lead``, the activation (a parameter,
        # timm's latent query, is no plain tensor)
        return launch(*args) if launches_directly(args[first], args, rest) else op(*args)

    def direct(*args: Any) -> Any:
        return launch(*prepare(*args))

    call.__name__ = call.__qualname__ = name
    # what a forward that launches directly calls (launches.forward_launches_directly), its inputs checked by it
    call.direct = launch if prepare is None else direct
    call.op, call.launch, call.check, call.empty = op, launch, check, empty  # the spec, read by OPS[name].spec
    call.reference, call.prepare, call.selfcheck = reference, prepare, selfcheck
    return call
