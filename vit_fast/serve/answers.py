"""Each request of a served batch answered on its own: a request the model cannot take gets its own error response
(a message, never a traceback or a path) and fails only itself; the console gets one line per refused request, at
most one a second (the rest counted and named in the next line). How the error reaches Triton through PyTriton 0.7:
docs/deploy.md, "Refused requests"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from vit_fast.model.vit import VisionTransformer
from vit_fast.serve.refusals import LINE_EVERY_S, RefusalLog
from vit_fast.serve.settings import REFUSED_KEY
from vit_fast.serve.threads import ThreadTuner
from vit_fast.serve.variable import forward_requests, request_problem


def refused(message: str) -> dict[str, Any]:
    """The response of one refused request: its error message, nothing else."""
    import numpy as np

    return {REFUSED_KEY: np.frombuffer(message.encode("utf-8", "replace"), dtype=np.uint8).copy()}


def failure_message(err: BaseException) -> str:
    """What a client is told when serving its batch failed on ``err``: our own checks' ValueError as it is, anything
    else by its type only (its text may name the server's files; the console has it)."""
    if isinstance(err, ValueError):
        return str(err)
    return f"the server failed to run this request's batch ({type(err).__name__}); its console says why"


def forward_stacked(
    model: VisionTransformer, images: Any, spec: Any, output_name: str, tuner: ThreadTuner | None
) -> dict[str, Any]:
    """One batch as Triton's dynamic batcher formed it, ``images [B, C, H, W]`` (``spec``: the input's name and
    dims) -> ``{output_name: [B, N]}``, on the tuner's threads where there is one."""
    import numpy as np

    want = (*spec.dims,)
    if images.ndim == 4 and images.shape[0] == 0:
        raise ValueError(f"empty batch: {spec.name} has 0 images (shape {list(images.shape)}); send >= 1")
    if images.ndim != 4 or tuple(images.shape[1:]) != want or images.shape[0] < 1:
        # Triton checks shapes against the config first; this guards the model should that change
        raise ValueError(f"{spec.name} must be [B >= 1, {', '.join(map(str, want))}], got {images.shape}")
    x = torch.from_numpy(np.ascontiguousarray(images)).to(model.device, model.dtype)
    if tuner is None:
        with torch.inference_mode():
            y = model(x)
        return {output_name: y.cpu().numpy()}
    threads = tuner.threads_for(len(x))
    try:
        if torch.get_num_threads() != threads:  # torch's count is per thread: each instance sets its own
            torch.set_num_threads(threads)
        with torch.inference_mode():
            y = model(x)
    finally:
        tuner.finished()
    return {output_name: y.numpy()}


def answer_each(
    requests: Sequence[Any], output_name: str, serve: Callable[[], list[dict[str, Any]]], log: RefusalLog
) -> list[dict[str, Any]]:
    """``serve()``'s answers for ``requests``, or, where it raises, each request answered with the failure's message
    (:func:`failure_message`; the console gets one line with its text, never a traceback)."""
    try:
        return serve()
    except Exception as err:
        log.note(f"a batch of {len(requests)} request(s) failed: {type(err).__name__}: {err}")
        return [refused(failure_message(err)) for _ in requests]


def answer_stacked(
    requests: Sequence[Any], input_name: str, output_name: str, infer: Callable[[Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Requests of one image size (Triton checked each against the config): their images stacked into one batch
    for ``infer`` (``{input: [B, C, H, W]}`` -> ``{output: [B, N]}``), whose rows go back to each request in order."""
    import numpy as np

    arrays = [request[input_name] for request in requests]
    rows = infer(np.concatenate(arrays))[output_name]  # a copy: PyTriton's arrays are read-only
    bounds = np.cumsum([0, *(len(a) for a in arrays)])
    return [{output_name: rows[i:j]} for i, j in zip(bounds[:-1], bounds[1:], strict=True)]


def answer_ragged(
    model: VisionTransformer,
    requests: Sequence[Any],
    names: tuple[str, str],
    max_side: int,
    tuner: ThreadTuner | None,
    log: RefusalLog,
) -> list[dict[str, Any]]:
    """A ragged batch (``--variable-size``; ``names``: the input and the output): every request is checked before any
    work (:func:`vit_fast.serve.variable.request_problem`); one the model cannot take gets its own error response and
    a console line, and the others' images run as one packed forward on the tuner's threads."""
    if not requests:
        raise ValueError("empty batch: no request to serve")
    input_name, output_name = names
    arrays = [request[input_name] for request in requests]
    problems = [request_problem(model, a, input_name, max_side) for a in arrays]
    for problem in filter(None, problems):
        log.note(problem)
    taken = [a for a, problem in zip(arrays, problems, strict=True) if problem is None]
    rows: list[Any] = []
    if taken:
        counts = [len(a) for a in taken]
        threads = None if tuner is None else tuner.threads_for(sum(counts))
        try:
            if threads is not None and torch.get_num_threads() != threads:  # per thread: each instance sets its own
                torch.set_num_threads(threads)
            rows = forward_requests(model, taken, counts)
        finally:
            if tuner is not None:
                tuner.finished()
    rows.reverse()
    return [{output_name: rows.pop()} if problem is None else refused(problem) for problem in problems]


__all__ = [
    "LINE_EVERY_S",
    "REFUSED_KEY",
    "RefusalLog",
    "answer_each",
    "answer_ragged",
    "answer_stacked",
    "failure_message",
    "forward_stacked",
    "refused",
]
