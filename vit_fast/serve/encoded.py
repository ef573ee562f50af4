"""``vit-fast serve --encoded``: requests carry encoded images (JPEG, PNG, WebP, BMP bytes: a BYTES input), decoded with
:mod:`vit_fast.interop.images` (JPEGs with nvJPEG on a GPU where it can, else Pillow in a thread pool) and preprocessed
with the model's own evaluation transform (:func:`vit_fast.image_transform`); answers are the logits and the top k
labels with their probabilities. A request whose bytes are too large, declare too many pixels or do not decode fails
alone. Why a mode: docs/deploy.md, "Serving encoded images: --encoded"."""

from __future__ import annotations

import io
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from vit_fast.interop.image_transform import ImageTransform, image_transform, model_labels, preprocess_batch
from vit_fast.interop.images import (
    GpuJpegs,
    PendingJpeg,
    gpu_jpeg_decoder,
    gpu_jpeg_header,
    image_files,
    pil_image_module,
)
from vit_fast.interop.predicting import runs_kernels
from vit_fast.model.vit import VisionTransformer
from vit_fast.serve.answers import refused

#: the BYTES input (one encoded image per element) and the top-k outputs beside the model's own
ENCODED_INPUT = "image_bytes"
LABELS_OUTPUT = "labels"
PROBABILITIES_OUTPUT = "probabilities"
#: an encoded image larger than this many bytes is refused before decoding
ENCODED_MAX_BYTES = 16 * 2**20
#: an image whose header declares more pixels than this is refused before decoding (a 4096 x 4096 photo)
ENCODED_MAX_PIXELS = 4096 * 4096
DEFAULT_TOP_K = 5
#: decode threads per served model (Pillow's decoders and torch's resize release the GIL)
DECODE_THREADS = 4
#: how many images a load test sends, at most (the pool its requests draw from)
LOAD_TEST_IMAGES = 64


def encoded_problem(
    data: bytes, max_bytes: int = ENCODED_MAX_BYTES, max_pixels: int = ENCODED_MAX_PIXELS
) -> str | None:
    """Why ``data`` is refused before any decoding (None: it may be decoded): empty, over ``max_bytes``, or a header
    that declares over ``max_pixels`` pixels (a decompression bomb). Bytes Pillow cannot identify pass here: decoding
    names them."""
    if not data:
        return "an empty image: send the bytes of a JPEG, PNG, WebP or BMP file"
    if len(data) > max_bytes:
        return f"an encoded image of {len(data):,} bytes, over the {max_bytes:,} this server decodes"
    Image = pil_image_module()
    try:
        with warnings.catch_warnings():  # Pillow's bomb warning: the count below decides, and says so
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as probe:  # reads the header only
                width, height = probe.size
    except Image.DecompressionBombError:  # Pillow's own bound, over twice its MAX_IMAGE_PIXELS
        return f"an image whose header declares more pixels than Pillow decodes, over the {max_pixels:,} of this server"
    except Exception:  # noqa: BLE001 (any header Pillow refuses is named by the decode that follows)
        return None
    if width * height > max_pixels:
        return f"an image of {width}x{height} pixels, over the {max_pixels:,} this server decodes"
    return None


def encoded_files(paths: Sequence[str | os.PathLike]) -> list[bytes]:
    """The bytes of the first :data:`LOAD_TEST_IMAGES` images ``paths`` name (files, or folders of them): what a load
    test sends. A file that is not a regular file, or is over :data:`ENCODED_MAX_BYTES`, is a ValueError naming it."""
    from vit_fast.util.files import read_head

    out = []
    for path in image_files(paths)[:LOAD_TEST_IMAGES]:
        data = read_head(path, ENCODED_MAX_BYTES + 1)
        if data is None:
            raise ValueError(f"image {str(path)!r} cannot be read as a regular file")
        if len(data) > ENCODED_MAX_BYTES:
            raise ValueError(f"image {str(path)!r} is over the {ENCODED_MAX_BYTES:,} bytes --encoded takes per image")
        out.append(data)
    return out


def perf_analyzer_data(blobs: Sequence[bytes]) -> str:
    """perf_analyzer's ``--input-data`` JSON text sending ``blobs`` round robin, one encoded image per request
    element: ``{"data": [{"image_bytes": {"content": {"b64": ...}, "shape": [1]}}, ...]}``, each BYTES element
    serialized as Triton's clients send it (a 4-byte little-endian length, then the bytes). Only "data" at the top:
    perf_analyzer refuses other members. docs/deploy.md, "perf_analyzer with image files"."""
    import base64
    import json
    import struct

    if not blobs:
        raise ValueError("perf_analyzer's input data needs at least one image")
    steps = [
        {ENCODED_INPUT: {"content": {"b64": base64.b64encode(struct.pack("<I", len(b)) + b).decode()}, "shape": [1]}}
        for b in blobs
    ]
    return json.dumps({"data": steps}, indent=1) + "\n"


def random_pngs(seed: int, count: int = LOAD_TEST_IMAGES) -> list[bytes]:
    """``count`` PNG files of random RGB pixels, 17 to 63 px a side (odd sizes: every one is resized), made in
    memory from ``seed``."""
    import numpy as np

    Image, rng, out = pil_image_module(), np.random.default_rng(seed), []
    for _ in range(count):
        h, w = (int(v) for v in rng.integers(17, 64, size=2))
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(buffer, "PNG")
        out.append(buffer.getvalue())
    return out


class EncodedImages:
    """The encoded-images side of a served ``model``: its tensors, its decode pool and its answers. ``top_k``: how
    many labels each image's answer carries (at most the model's classes)."""

    def __init__(self, model: VisionTransformer, output_name: str, top_k: int = DEFAULT_TOP_K) -> None:
        cfg = model.cfg
        if not cfg.num_classes:
            raise ValueError("--encoded answers labels: the model has no classifier head (num_classes 0)")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
        pil_image_module()  # Pillow decodes the requests: a missing extra is named before the server starts
        self.transform: ImageTransform = image_transform(model)
        pre = self.transform.preprocessing
        want = (cfg.in_chans, *cfg.img_hw)
        if (pre.channels, *(pre.output_hw or (-1, -1))) != want:
            raise ValueError(
                f"the model's preprocessing ({self.transform.source}) makes {pre.channels}x{pre.output_hw or 'any'} "
                f"images, not the {want[0]}x{want[1:]} the model takes: --encoded needs one fixed size"
            )
        self.output_name = output_name
        self.top_k = min(top_k, cfg.num_classes)
        self.labels = model_labels(model) or [str(i) for i in range(cfg.num_classes)]
        #: where the model runs: JPEGs are decoded and every image preprocessed there when ``gpu`` is set
        self.device = next(model.parameters()).device
        self.kernel = runs_kernels(model)
        decode, self.decoder = gpu_jpeg_decoder(self.device, cfg.in_chans)
        #: the GPU's JPEG decoder (None: Pillow decodes every image in the thread pool; ``decoder`` says why)
        self.gpu = None if decode is None else GpuJpegs(decode)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()  # instance threads share the pool

    def describe(self) -> str:
        """One line for the server's description."""
        return (
            f"served from encoded images ({ENCODED_INPUT} [1], BYTES) decoded and preprocessed as "
            f"{self.transform.source} says (JPEGs decoded by {self.decoder}); logits, and the top {self.top_k} "
            f"{LABELS_OUTPUT} and {PROBABILITIES_OUTPUT}"
        )

    def tensors(self, np_dtype: Any) -> tuple[list[Any], list[Any]]:
        """PyTriton's inputs and outputs: ``image_bytes [1]`` (BYTES) in; logits, labels, probabilities out."""
        import numpy as np
        from pytriton.model_config import Tensor

        inputs = [Tensor(name=ENCODED_INPUT, dtype=np.bytes_, shape=(1,))]
        outputs = [
            Tensor(name=self.output_name, dtype=np_dtype, shape=(len(self.labels),)),
            Tensor(name=LABELS_OUTPUT, dtype=np.bytes_, shape=(self.top_k,)),
            Tensor(name=PROBABILITIES_OUTPUT, dtype=np.float32, shape=(self.top_k,)),
        ]
        return inputs, outputs

    def decode(self, data: bytes) -> torch.Tensor | str:
        """One encoded image -> the model's input ``[C, H, W]`` float32, or why it has none."""
        problem = encoded_problem(data)
        if problem is not None:
            return problem
        try:
            return self.transform(data)
        except (ValueError, OSError, TypeError) as err:
            return " ".join(str(err).split()) or type(err).__name__

    def pixels(self, data: bytes) -> torch.Tensor | PendingJpeg | str:
        """One encoded image -> Pillow's uint8 ``[C, H, W]``, a JPEG left encoded for the GPU, or why it has none."""
        problem = encoded_problem(data)
        if problem is not None:
            return problem
        header = gpu_jpeg_header(data)
        if header is not None:
            return PendingJpeg(data, header)
        return self.pil_pixels(data)

    def pil_pixels(self, data: bytes) -> torch.Tensor | str:
        """One encoded image decoded by Pillow: uint8 ``[C, H, W]``, or why it cannot be."""
        try:
            return self.transform.pixels(data)
        except (ValueError, OSError, TypeError) as err:
            return " ".join(str(err).split()) or type(err).__name__

    def decode_on_gpu(self, pool: ThreadPoolExecutor, flat: list[bytes]) -> list[torch.Tensor | str]:
        """``flat``'s images preprocessed on the model's GPU: headers read and other formats decoded in ``pool``,
        the JPEGs in one nvJPEG batch (Pillow for any it refuses), then all preprocessed as one batch there."""
        assert self.gpu is not None
        decoded = self.gpu.complete(list(pool.map(self.pixels, flat)), self.pil_pixels)
        at = [i for i, x in enumerate(decoded) if isinstance(x, torch.Tensor)]
        if at:
            images = [decoded[i].to(self.device) for i in at]  # type: ignore[union-attr]
            ready, _ = preprocess_batch(self.transform.preprocessing, images, device=self.device, kernel=self.kernel)
            for i, x in zip(at, ready, strict=True):
                decoded[i] = x
        return decoded

    def decode_requests(self, requests: Sequence[Any]) -> list[torch.Tensor | str]:
        """Each request's images ``[B, C, H, W]``, or the first reason one of them cannot be decoded."""
        blobs = [[bytes(item) for item in request[ENCODED_INPUT].reshape(-1)] for request in requests]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="vit-fast-serve-decode")
            pool = self._pool
        every = [b for request in blobs for b in request]
        flat = list(pool.map(self.decode, every)) if self.gpu is None else self.decode_on_gpu(pool, every)
        out: list[torch.Tensor | str] = []
        for request in blobs:
            mine, flat = flat[: len(request)], flat[len(request) :]
            bad = [(i, x) for i, x in enumerate(mine) if isinstance(x, str)]
            if not mine:
                out.append(f"{ENCODED_INPUT} holds no image: send one encoded image per element")
            elif bad:
                out.append(f"image {bad[0][0]} of the request: {bad[0][1]}")
            else:
                out.append(torch.stack(mine))  # type: ignore[arg-type]
        return out

    def answer(self, requests: Sequence[Any], infer: Callable[[Any], Any], log: Any) -> list[dict[str, Any]]:
        """One response per request, in order: a request with an image that cannot be decoded gets its own error (and
        a console line in ``log``); the others' images run as one batch through ``infer`` ([B, C, H, W] ->
        ``{output: logits}``)."""
        decoded = self.decode_requests(requests)
        for problem in decoded:
            if isinstance(problem, str):
                log.note(problem)
        taken = [x for x in decoded if not isinstance(x, str)]
        if not taken:
            return [refused(x) for x in decoded]  # type: ignore[arg-type]
        logits = infer(torch.cat(taken).cpu().numpy())[self.output_name]  # infer takes host arrays
        answers, start = [], 0
        for x in decoded:
            if isinstance(x, str):
                answers.append(refused(x))
                continue
            rows = logits[start : start + len(x)]
            start += len(x)
            answers.append(self.top(rows))
        return answers

    def top(self, logits: Any) -> dict[str, Any]:
        """``logits [B, N]`` -> this server's outputs for them: the logits, and the top k labels and probabilities."""
        import numpy as np

        probs = torch.softmax(torch.from_numpy(np.asarray(logits, dtype=np.float64)), dim=-1)
        values, indices = probs.topk(self.top_k, dim=-1)
        names = np.array([[self.labels[i].encode() for i in row] for row in indices.tolist()], dtype=np.object_)
        return {
            self.output_name: logits,
            LABELS_OUTPUT: names,
            PROBABILITIES_OUTPUT: values.numpy().astype(np.float32),
        }

    def ready_input(self, client_module: Any) -> Any:
        """The ready check's request input (``tritonclient.http`` or ``.grpc``): one black image of the model's size."""
        import numpy as np

        image = np.array([[self.sample_png()]], dtype=np.object_)
        request = client_module.InferInput(ENCODED_INPUT, list(image.shape), "BYTES")
        request.set_data_from_numpy(image)
        return request

    def sample_png(self) -> bytes:
        """A black PNG of the model's input size: what the ready check sends."""
        import numpy as np

        c, (h, w) = self.transform.preprocessing.channels, self.transform.preprocessing.output_hw or (1, 1)
        buffer = io.BytesIO()
        pil_image_module().fromarray(np.zeros((h, w, 3) if c == 3 else (h, w), np.uint8)).save(buffer, "PNG")
        return buffer.getvalue()

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = [
    "DECODE_THREADS",
    "DEFAULT_TOP_K",
    "ENCODED_INPUT",
    "ENCODED_MAX_BYTES",
    "ENCODED_MAX_PIXELS",
    "EncodedImages",
    "LABELS_OUTPUT",
    "PROBABILITIES_OUTPUT",
    "LOAD_TEST_IMAGES",
    "encoded_files",
    "encoded_problem",
    "perf_analyzer_data",
    "random_pngs",
]
