"""What :func:`vit_fast.export.verify.verify` checks before any input is run: the batches to verify, the
artifact's outputs and architecture against the model's, its fixed input size, and labelled data's shape."""

from __future__ import annotations

from typing import Any

import torch

from ._common import ArtifactError
from .graph import default_outputs
from .runners import Runner


def default_batches(batch_range: tuple[int, int]) -> list[int]:
    """Batch 1 (or the minimum), an odd batch inside the range, and the maximum."""
    lo, hi = batch_range
    odd = next((b for b in (3, 5, 7) if lo < b < hi), None)
    if odd is None:
        odd = next((b for b in range(lo + 1, hi) if b % 2), lo)
    return sorted({lo, odd, hi})


def quicker_check(batches: list[int], batch_range: tuple[int, int] | None, flag: str = "--batch") -> str:
    """The smaller check a note on a slow machine suggests: ``batches`` below the largest (at most two), or the
    range's minimum, as ``flag`` and as the API's ``batches=``. Only what is verified changes: with an
    exporter's ``--verify-batch`` the note says that the artifact keeps its batch range."""
    fewer = sorted(b for b in set(batches) if b < max(batches))[:2] or [batch_range[0] if batch_range else 1]
    text = f"{flag} {','.join(map(str, fewer))} (batches={fewer}) for a quicker check"
    if flag != "--batch" and batch_range:
        text += f"; the artifact keeps its batch range {batch_range[0]}..{batch_range[1]}"
    return text


def check_verify_batches(
    batches: list[int] | None, batch_range: tuple[int, int], flag: str = "--verify-batch", what: str = "artifact"
) -> None:
    """Refuse, before any work, batches to verify that the artifact will not take: each must be an int in
    ``batch_range`` (``(min, max)``, inclusive), the range it is exported or built for."""
    if batches is None:
        return
    lo, hi = batch_range
    if not batches or any(isinstance(b, bool) or not isinstance(b, int) for b in batches):
        raise ValueError(f"{flag} takes batch sizes (ints), got {batches!r}")
    outside = [b for b in batches if not lo <= b <= hi]
    if outside:
        raise ValueError(
            f"{flag} {','.join(map(str, batches))}: batch {outside[0]} is outside the {what}'s batch range "
            f"{lo}..{hi}: verify batches within it, or widen the range itself (--batch; batch= in the API)"
        )


def output_plan(meta: dict[str, Any] | None, runner: Runner, num_classes: int) -> list[tuple[str, str]]:
    """``(output kind, the runner's output name)`` for every output the artifact's graph returns."""
    kinds = list((meta or {}).get("outputs") or default_outputs(num_classes))
    names = list((meta or {}).get("output_names") or runner.output_names[: len(kinds)])
    missing = [n for n in names if n not in runner.output_names]
    if missing or len(names) != len(kinds):
        raise ArtifactError(
            f"the metadata names outputs {names} ({kinds}), but the artifact has outputs {runner.output_names}"
        )
    return list(zip(kinds, names, strict=True))


def check_config(meta: dict[str, Any] | None, cfg: Any, artifact: Any) -> None:
    """Raise naming the fields where the config recorded in the artifact's metadata differs from the model's."""
    if meta and isinstance(meta.get("config"), dict):
        theirs = {k: v for k, v in meta["config"].items() if k != "dynamic_img_size"}
        ours = {k: v for k, v in cfg.to_dict().items() if k != "dynamic_img_size"}
        diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        if diff:
            raise ValueError(
                f"{str(artifact)!r} was exported from another architecture: config fields {diff} differ "
                f"(artifact {[theirs.get(k) for k in diff]}, model {[ours.get(k) for k in diff]})"
            )


def check_input_size(
    runner: Runner, channels: int, sizes: list[tuple[int, int]], preprocess: dict | None, artifact: Any
) -> None:
    """Raise ValueError naming both sizes when the artifact's fixed input dims (``runner.image_shape``, where the
    runner knows them) do not fit the model's images, before any input is run (ONNX Runtime would answer with
    its raw "Got invalid dimensions" text)."""
    fixed = getattr(runner, "image_shape", None)
    if not fixed or len(fixed) != 3:
        return
    nhwc = bool(preprocess) and preprocess.get("layout") == "NHWC"
    for h, w in sizes:
        want = (h, w, channels) if nhwc else (channels, h, w)
        if all(not isinstance(have, int) or have == need for have, need in zip(fixed, want, strict=True)):
            continue
        theirs_h, theirs_w = (fixed[0], fixed[1]) if nhwc else (fixed[1], fixed[2])
        raise ValueError(
            f"{str(artifact)!r} was exported for {theirs_h}x{theirs_w} images (input dims {list(fixed)}), but the "
            f"model takes {h}x{w} images ({channels} channels): verify it against the model it was exported from, "
            "or export this model again"
        )


def check_data(data: Any, preprocess: dict[str, Any] | None, kinds: list[str], channels: int) -> None:
    """Raise naming what is wrong with a labelled set ``(images, labels [N])`` before it is verified: images
    ``[N, C, H, W]`` (uint8 ``[N, H, W, C]`` for an artifact with an NHWC preprocessing front)."""
    images, labels = data
    if images.ndim != 4 or labels.ndim != 1 or images.shape[0] != labels.shape[0] or images.shape[0] == 0:
        raise ValueError(
            f"data must be (images [N, C, H, W], labels [N]) with N >= 1, got {tuple(images.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if "logits" not in kinds:
        raise ValueError(f"data= measures accuracy on the 'logits' output; this artifact returns {kinds}")
    if preprocess and images.dtype != torch.uint8:
        raise ValueError(
            f"this artifact takes uint8 images ({preprocess['layout']}) through its preprocessing front: data "
            f"images must be uint8 pixels, got {images.dtype}"
        )
    nhwc = bool(preprocess) and preprocess.get("layout") == "NHWC"
    if images.shape[3 if nhwc else 1] != channels:
        layout = "[N, H, W, C]" if nhwc else "[N, C, H, W]"
        fix = "images.permute(0, 2, 3, 1)" if nhwc else "images.permute(0, 3, 1, 2)"
        raise ValueError(
            f"data images have shape {tuple(images.shape)}, but this artifact takes {channels}-channel images as "
            f"{layout}: give them in that layout (e.g. {fix})"
        )
