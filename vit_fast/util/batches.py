"""The one parser of batch-size lists (``"1,8,64"``), shared by the CLI, the bench and the Triton
repository writer; each wraps its ValueError in its own error type."""

from __future__ import annotations

from collections.abc import Sequence

#: the largest batch size accepted: tensor dimensions of ONNX Runtime's and TensorRT's shapes are int32 there,
#: and a larger number is a typo long before it is a batch (torch fails on it with C++ frames)
MAX_BATCH = 2**31 - 1


def parse_batch_list(text: str | Sequence[int], names: Sequence[str] = ()) -> list[int]:
    """``"1,8,64"`` (or a sequence of ints) -> ``[1, 8, 64]``; a ValueError names the bad item. With ``names`` (e.g.
    ``("MIN", "MAX")``) exactly that many items, in that order, repeats allowed (a range: its order is checked where
    it is used); without, any number of distinct sizes >= 1. Every size is at most :data:`MAX_BATCH`."""
    form = ",".join(names) if names else "comma-separated ints"
    example = ",".join(str(b) for b in (1, 8, 64)[: len(names) or 3])
    items = [str(t).strip() for t in (str(text).split(",") if isinstance(text, str) else text)]
    if not items or any(not t for t in items):
        raise ValueError(f"{text!r} has an empty entry: give {form}, e.g. {example}")
    sizes: list[int] = []
    for item in items:
        try:
            b = int(item)
        except ValueError:
            raise ValueError(f"batch size {item!r} in {text!r} is not an int: give {form}, e.g. {example}") from None
        if b < 1:
            raise ValueError(f"batch size {b} in {text!r} must be >= 1: give {form}, e.g. {example}")
        if b > MAX_BATCH:
            raise ValueError(f"batch size {b} in {text!r} is too large: give sizes from 1 to {MAX_BATCH}")
        if not names and b in sizes:
            raise ValueError(f"batch size {b} appears twice in {text!r}")
        sizes.append(b)
    if names and len(sizes) != len(names):
        raise ValueError(f"{text!r} has {len(sizes)} item(s); give {form}, e.g. {example}")
    return sizes
