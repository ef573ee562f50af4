"""Stand-ins shared by the tests: small models (ours, ``tiny_model``; transformers', ``tiny_hf_classifier``; timm
weights made ``trained_like``), padded native-resolution batches (NaFlex, SigLIP 2), inputs in float64 or requiring
grad, calls and kernel launches counted, a patched model's eager and float64 results and its export and first-use
checks on the kernels, a failing publish, ``load_script`` for tools/ and benchmarks/, and the skips for a broken
interpreter."""

from __future__ import annotations

import copy
import importlib.util
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import vit_fast
from vit_fast import VisionTransformer, ViTConfig
from vit_fast.base.interpret import interpreter_enabled, interpreter_version_problem

from .numerics import assert_within_eager


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` (tools/ and benchmarks/ are no packages) loaded as a new module named ``name``. Loading
    runs its imports and definitions only: its work starts in ``main()``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_hf_classifier(num_labels: int = 4, seed: int = 0, image_size: int = 32) -> Any:
    """transformers' ViTForImageClassification, ``image_size`` px / 8 px patches, 32 wide, one block; every parameter
    random. Its config names the architecture, as a ``save_pretrained`` folder's does."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(seed)
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=image_size,
        patch_size=8,
        num_labels=num_labels,
        architectures=["ViTForImageClassification"],
    )
    model = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():  # HF zero-inits biases and LayerNorm; randomise so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A timm model's weights as training leaves them, in place; returns it in eval mode: signed LayerScale gammas,
    norm scales far from 1 (a ResPostBlock's norms start at init_values), every other parameter (biases that start
    at zero included) perturbed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gamma"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.ndim == 1 and "norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.5)
            else:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def kernel_launches(call: Callable[[], Any]) -> tuple[Any, Counter]:
    """``call()``'s result and how many times each of our kernels launched in it, by kernel name
    (``vit_fast.kernels.launches.record_launches``; under Triton's interpreter too): a fallback to eager PyTorch
    launches none."""
    from vit_fast.kernels.launches import record_launches

    with record_launches() as launches:
        result = call()
    return result, Counter(launch["kernel"] for launch in launches)


def assert_attention_launches(launches: Counter, attention: int, pool: int = 0, *, padded: bool) -> None:
    """The attention kernel (plain or differential) launched ``attention`` times and the attention-pool kernel
    ``pool`` times in ``launches`` (:func:`kernel_launches`). A ``padded`` batch's attention runs on the kernel with
    its key-padding lengths (:mod:`vit_fast.interop.naflex`); its attention-pool head runs in PyTorch (that kernel takes
    no lengths), so ``pool`` is not expected there."""
    seen = Counter(
        attention=launches["_attention_kernel"] + launches["_diff_attention_kernel"],
        pool=launches["_attention_pool_kernel"],
    )
    expected = Counter(attention=attention, pool=0 if padded else pool)
    assert seen == expected, f"attention launches {dict(seen)}, expected {dict(expected)} (padded={padded}): {launches}"


def naflex_batch(sizes: list[tuple[int, int]], patch: int, seed: int) -> dict[str, torch.Tensor]:
    """Random images of ``sizes`` (h, w pixels) packed and padded as timm's NaFlex loader hands them to a
    ``NaFlexVit`` (:func:`vit_fast.interop.naflex.pack_images`): ``patches``, ``patch_coord``, ``patch_valid``."""
    from vit_fast.interop.naflex import pack_images

    gen = torch.Generator().manual_seed(seed)
    return pack_images([torch.randn(3, h, w, generator=gen) for h, w in sizes], patch)


def siglip2_batch(shapes: list[tuple[int, int]], patch: int, seed: int) -> dict[str, torch.Tensor]:
    """Images of ``shapes`` (rows x columns of ``patch``-pixel patches) as transformers' Siglip2ImageProcessor hands
    them over: ``pixel_values [B, T, 3 * patch * patch]`` (patches packed per image and padded at the end to the
    longest), ``pixel_attention_mask [B, T]`` (1: a patch, 0: padding), ``spatial_shapes [B, 2]``."""
    gen = torch.Generator().manual_seed(seed)
    tokens = max(h * w for h, w in shapes)
    pixel_values = torch.randn(len(shapes), tokens, 3 * patch * patch, generator=gen)
    lengths = torch.tensor([h * w for h, w in shapes])
    mask = (torch.arange(tokens) < lengths[:, None]).long()
    return dict(pixel_values=pixel_values, pixel_attention_mask=mask, spatial_shapes=torch.tensor(shapes))


Inputs = torch.Tensor | dict[str, torch.Tensor]


def as_float64(inputs: Inputs) -> Inputs:
    """A model's inputs (an image tensor, or a dict of them) with the floating ones in float64; masks, coordinates
    and shapes as they are."""
    if isinstance(inputs, torch.Tensor):
        return inputs.double()
    return {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}


def requiring_grad(inputs: Inputs) -> tuple[Inputs, torch.Tensor]:
    """A copy of a model's inputs whose one floating tensor (the pixels or patches) requires grad, and that tensor."""
    if isinstance(inputs, torch.Tensor):
        leaf = inputs.clone().requires_grad_()
        return leaf, leaf
    (key,) = [k for k, v in inputs.items() if v.is_floating_point()]
    leaf = inputs[key].clone().requires_grad_()
    return {**inputs, key: leaf}, leaf


def fail_replace_onto(monkeypatch: pytest.MonkeyPatch, suffix: str, staging_mark: str) -> None:
    """Make the move of a staged file (a path holding ``staging_mark``) onto a target ending in ``suffix`` fail with
    ENOSPC, however vit_fast.util.files moves it (a rename that cannot replace, an exchange, ``os.replace``); every
    other move goes through."""
    from vit_fast.util import files

    real = files.publishing.rename_path

    def rename(src: Any, dst: Any, mode: str) -> bool:
        if str(dst).endswith(suffix) and staging_mark in str(src):
            raise OSError(28, "No space left on device")
        return real(src, dst, mode)

    monkeypatch.setattr(files.publishing, "rename_path", rename)


def interpreter_fault() -> str | None:
    """Why the kernels cannot run in Triton's interpreter where this suite runs them there (no GPU, or
    TRITON_INTERPRET set): the installed triton and numpy break it. None otherwise."""
    if torch.cuda.is_available() and not interpreter_enabled():
        return None
    return interpreter_version_problem()


# For a test that judges what a command reports after running the kernels in the interpreter: where the installed
# triton and numpy break it, the command reports that instead (tests/apps/test_doctor.py and
# tests/kernels/test_versions.py check it), so the test is skipped with the reason. A test that meets the error itself
# is skipped by conftest.py. the command runs the interpreter on any machine (``vit-fast doctor --device cpu``, the
# demo's verify child)
skip_if_interpreter_broken = pytest.mark.skipif(
    interpreter_version_problem() is not None, reason=str(interpreter_version_problem())
)
#: the command runs the kernels where the suite does: in the interpreter without a GPU (``vit-fast doctor``,
#: ``vit-fast verify MODEL triton``)
skip_if_interpreted_and_broken = pytest.mark.skipif(interpreter_fault() is not None, reason=str(interpreter_fault()))

TINY = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=7)


def tiny_model(seed: int = 0, **overrides) -> VisionTransformer:
    """A tiny ViT with random (non-trivial) weights: LayerNorm affine and biases are random too."""
    torch.manual_seed(seed)
    model = VisionTransformer(ViTConfig(**{**TINY, **overrides}), backend="torch").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def record_triton_forwards(monkeypatch) -> list[tuple[int, bool]]:
    """Replace the triton path's forward with one that records ``(batch, tuning on)`` per call and returns zeros:
    what a test of who tunes when (bench, serve) needs, without running the kernels."""
    from vit_fast.kernels import autotune
    from vit_fast.model import stages

    seen: list[tuple[int, bool]] = []

    def features(model, x, grid, *plan_and_stage):
        seen.append((x.shape[0], autotune.autotune_enabled()))
        return torch.zeros(x.shape[0], model.cfg.num_tokens, model.cfg.embed_dim)

    monkeypatch.delenv("VIT_FAST_AUTOTUNE", raising=False)
    monkeypatch.setattr(stages, "features_triton", features)
    return seen


def count_calls(monkeypatch, owner: Any, name: str = "run") -> list[int]:
    """One entry per call of ``owner.<name>`` (a method or a function) from now on, the call itself going through:
    with ``timm_blocks.BlockPlan`` a block's run on the kernels, with ``PoolPlan`` an attention-pool head's (a
    fallback to timm's or transformers' own forward makes none)."""
    calls: list[int] = []
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    return calls


def eager_and_float64(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``model(x)`` and what a float64 copy of the model computes on ``x`` in float64, without grad: the two results
    the numerics rule judges a patched model's output by. ``model`` itself is left as it was."""
    with torch.no_grad():
        return model(x), copy.deepcopy(model).double()(x.double())


def export_on_the_kernels(model: torch.nn.Module, x: torch.Tensor, what: str) -> set[str]:
    """Patch a timm model in place onto the kernels (backend='triton') and ``torch.export`` it on ``x``: the exported
    program meets the numerics rule (against the unpatched model in float64, as eager does). Returns the ops its graph
    calls, as ``str`` of each call_function target, for the caller to look for its own."""
    eager, expected = eager_and_float64(model, x)
    vit_fast.apply_vit_fast(model, backend="triton")
    exported = torch.export.export(model, (x,))
    with torch.no_grad():
        assert_within_eager(exported.module()(x), eager, expected, name=what)
    return {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}


def check_first_use_net(monkeypatch, model, x: torch.Tensor, op: str, what: str) -> None:
    """The first-use safety net on the public op ``op`` of ``vit_fast.backend.triton_path`` in a timm model patched in
    place: its first output is judged and recorded as passed; a wrong kernel (output + 0.5) then falls back to the
    eager reference with a RuntimeWarning, and the model still meets the numerics rule against itself in float64.
    (Patched timm blocks and heads call the public op, not the direct launcher.)"""
    from vit_fast.backend import first_use, triton_path

    monkeypatch.setenv(first_use.ENV, "1")
    first_use.reset()
    eager, expected = eager_and_float64(model, x)
    vit_fast.apply_vit_fast(model, backend="triton")
    try:
        with torch.no_grad():
            model(x)
        found = [f for f in first_use.report()["checked"] if f["op"] == op]
        assert len(found) == 1 and found[0]["passed"]
        first_use.reset()
        # each ops instance holds the kernel op's call (or, launching directly, its launcher) as an attribute
        (attribute,) = [f"_{name}" for name, judged in triton_path._CHECKS.items() if judged.op == op]
        held = [v for v in vars(triton_path).values() if isinstance(v, triton_path._Ops)]
        held += [o for v in vars(triton_path).values() if isinstance(v, dict) for o in v.values()]
        for ops in [o for o in held if isinstance(o, triton_path._Ops)]:
            real_op = getattr(ops, attribute)
            monkeypatch.setattr(ops, attribute, lambda *a, _real=real_op, **k: _real(*a, **k) + 0.5)
        with pytest.warns(RuntimeWarning, match=f"'{op}' runs in eager PyTorch"), torch.no_grad():
            ours = model(x)
        assert first_use.failed_ops() == {op}
        assert_within_eager(ours, eager, expected, name=f"{what} after fallback")
    finally:
        first_use.reset()
