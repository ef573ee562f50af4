"""Image files to answers: :func:`predict_files` decodes files in a small thread pool (JPEGs on the GPU with nvJPEG
where :func:`~vit_fast.interop.images.gpu_jpeg_decoder` allows), preprocesses each batch (one fused-kernel launch on
the triton backend), runs the model and yields each batch's top-k labels (or pooled features) as it finishes, a file
that cannot be decoded answered with its reason. ``vit-fast predict`` and benchmarks/pipeline.py run it; see
docs/cli.md, "vit-fast predict"."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from vit_fast.interop.image_transform import EAGER, FUSED, ImageTransform, fused_unsupported, preprocess_batch
from vit_fast.interop.images import JPEG_SIGNATURE, GpuJpegs, PendingJpeg, gpu_jpeg_decoder, gpu_jpeg_header

#: a file over this many bytes is never read whole for the GPU decoder (Pillow reads it from the path)
GPU_READ_MAX_BYTES = 64 * 2**20

#: decode threads by default: PIL's decoders and torch's resize release the GIL, so a few threads keep a CPU forward fed
DEFAULT_THREADS = min(4, os.cpu_count() or 1)


@dataclass
class Prediction:
    """One image's answer: its ``file``; ``labels`` / ``probabilities`` / ``indices`` of the top k classes (best
    first; empty with features); its pooled ``feature`` ``[D]`` where asked for; or ``error``, why it has none;
    ``preprocessing``: what preprocessed it (:func:`~vit_fast.interop.image_transform.preprocess_batch`'s answer)."""

    file: str
    labels: list[str]
    probabilities: list[float]
    indices: list[int]
    feature: torch.Tensor | None = None
    error: str | None = None
    preprocessing: str = ""

    def to_dict(self, transform: ImageTransform | None = None) -> dict[str, Any]:
        """The JSON row: file and top k (and, given the ``transform`` that ran, ``preprocessing``: what ran, why
        not the kernel, its parameters), or file and error."""
        if self.error is not None:
            return {"file": self.file, "error": self.error}
        row: dict[str, Any] = {"file": self.file}
        if self.indices:
            row.update(
                labels=self.labels, probabilities=[round(p, 6) for p in self.probabilities], indices=self.indices
            )
        if transform is not None and self.preprocessing:
            ran, _, why = self.preprocessing.partition(": ")
            ran = "image_transform" if ran == EAGER else ran
            row["preprocessing"] = {"ran": ran, **({"why": why} if why else {}), **transform.as_dict()}
        return row


def _pixels(transform: ImageTransform, source: Path | bytes) -> torch.Tensor | str:
    """``source`` decoded by Pillow (uint8 ``[C, H, W]``), or why it cannot be."""
    try:
        return transform.pixels(source)
    except (ValueError, OSError, TypeError) as err:  # a file that cannot be decoded: its reason, the rest go on
        return " ".join(str(err).split()) or type(err).__name__


def _load(transform: ImageTransform, path: Path, eager: bool, gpu: bool = False) -> torch.Tensor | PendingJpeg | str:
    """``path`` decoded (uint8 ``[C, H, W]``), and preprocessed here in its thread where the kernel will not run;
    with ``gpu``, a JPEG nvJPEG may decode is left encoded for the batch's one GPU decode."""
    if gpu:
        from vit_fast.util.files import read_head

        first = read_head(path, len(JPEG_SIGNATURE))  # another format is read once, by Pillow
        data = read_head(path, GPU_READ_MAX_BYTES + 1) if first == JPEG_SIGNATURE else None
        header = None if data is None or len(data) > GPU_READ_MAX_BYTES else gpu_jpeg_header(data)
        if header is not None:
            return PendingJpeg(data, header, path)  # type: ignore[arg-type]
    pixels = _pixels(transform, path)
    if not eager or isinstance(pixels, str):
        return pixels
    (x,), _ = preprocess_batch(transform.preprocessing, [pixels], kernel=False)
    return x


def runs_kernels(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs vit-fast's Triton kernels for inputs on its weights' device."""
    resolved = getattr(model, "resolved_backend", None)
    return resolved is not None and resolved(next(model.parameters()).device) == "triton"


def forward_batch(
    model: torch.nn.Module, images: Sequence[torch.Tensor] | torch.Tensor, features: bool
) -> torch.Tensor:
    """Logits ``[N, classes]`` (pooled features ``[N, D]`` with ``features``) of preprocessed ``[C, H, W]`` images
    (or a batch ``[N, C, H, W]``, run as it is); images of one shape run as one batch."""
    ref = next(model.parameters())

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.to(device=ref.device, dtype=ref.dtype)
        return model.forward_head(model.forward_features(x), pre_logits=True) if features else model(x)

    if isinstance(images, torch.Tensor):
        with torch.inference_mode():
            return run(images).float().cpu()
    shapes = {tuple(x.shape) for x in images}
    groups = [list(range(len(images)))] if len(shapes) == 1 else [[i] for i in range(len(images))]
    out: list[torch.Tensor | None] = [None] * len(images)
    with torch.inference_mode():
        for group in groups:
            y = run(torch.stack([images[i] for i in group]))
            for j, i in enumerate(group):
                out[i] = y[j].float().cpu()
    return torch.stack(out)  # type: ignore[arg-type]


def predict_files(
    model: torch.nn.Module,
    files: Sequence[str | os.PathLike],
    transform: ImageTransform,
    *,
    batch: int = 16,
    threads: int = DEFAULT_THREADS,
    top_k: int = 5,
    labels: Sequence[str] | None = None,
    features: bool = False,
    kernel: bool | None = None,
) -> Iterator[list[Prediction]]:
    """Each batch of ``files``' answers, in the files' order, as it finishes: top ``top_k`` of the softmax over
    ``model``'s logits (named by ``labels`` where given, else the class index), or with ``features`` the pooled
    feature. Decoding runs ``threads`` wide, two batches ahead; ``kernel`` (default: the model runs the triton
    backend): preprocess each batch in one fused-kernel launch where it can (else in the decode threads)."""
    paths = [Path(f) for f in files]
    ref = next(model.parameters())
    pre = transform.preprocessing
    uses_kernel = runs_kernels(model) if kernel is None else kernel
    reason = fused_unsupported(pre, ref.device, uses_kernel)
    how = FUSED if reason is None else f"{EAGER}: {reason}"
    out_dtype = ref.dtype if ref.dtype in (torch.float16, torch.bfloat16) else torch.float32
    decode, decoder = gpu_jpeg_decoder(ref.device, pre.channels)
    gpu = None if decode is None else GpuJpegs(decode)
    load = partial(_load, transform, eager=reason is not None and gpu is None, gpu=gpu is not None)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="vit-fast-decode") as pool:
        pending: deque[tuple[Path, Future]] = deque()
        upcoming = iter(paths)
        for path in upcoming:  # the first two batches start decoding at once
            pending.append((path, pool.submit(load, path)))
            if len(pending) >= 2 * batch:
                break
        while pending:
            chunk = [pending.popleft() for _ in range(min(batch, len(pending)))]
            for path in upcoming:  # refill while the model runs on this batch
                pending.append((path, pool.submit(load, path)))
                if len(pending) >= 2 * batch:
                    break
            loaded = [(path, future.result()) for path, future in chunk]
            if gpu is not None:  # the chunk's JPEGs in one nvJPEG batch; Pillow for any it refuses
                done = gpu.complete([x for _, x in loaded], partial(_pixels, transform))
                loaded = list(zip([path for path, _ in loaded], done, strict=True))
            good = [(path, x) for path, x in loaded if isinstance(x, torch.Tensor)]
            answers: dict[Path, Prediction] = {}
            if good:
                inputs: Sequence[torch.Tensor] | torch.Tensor = [x for _, x in good]
                if gpu is not None:  # every image on the GPU, preprocessed there (fused where it can)
                    inputs = [x.to(ref.device) for x in inputs]
                    inputs, how = preprocess_batch(
                        pre, inputs, device=ref.device, out_dtype=out_dtype, kernel=uses_kernel
                    )
                    how = f"{how}; JPEGs decoded by {decoder}"
                elif reason is None:
                    inputs, how = preprocess_batch(pre, list(inputs), device=ref.device, out_dtype=out_dtype)
                out = forward_batch(model, inputs, features)
                for (path, _), row in zip(good, out, strict=True):
                    answers[path] = _answer(path, row, features, top_k, labels, how)
            yield [
                answers.get(path) or Prediction(str(path), [], [], [], error=str(x), preprocessing=how)
                for path, x in loaded
                if not isinstance(x, torch.Tensor) or path in answers
            ]


def _answer(
    path: Path, row: torch.Tensor, features: bool, top_k: int, labels: Sequence[str] | None, how: str
) -> Prediction:
    if features:
        return Prediction(str(path), [], [], [], feature=row, preprocessing=how)
    probs = torch.softmax(row.double(), dim=-1)
    values, indices = probs.topk(min(top_k, probs.numel()))
    idx = [int(i) for i in indices]
    names = [labels[i] if labels is not None and i < len(labels) else str(i) for i in idx]
    return Prediction(str(path), names, [float(v) for v in values], idx, preprocessing=how)
