"""What one HTTP inference request declares (KServe v2: ``inputs[].shape``, ``datatype``, JSON ``data``,
``binary_data_size``, shared memory), checked against the served model's limits before Triton reads it: stdlib only,
run by :mod:`vit_fast.serve.front` in a process of its own. Why: docs/deploy.md, "The HTTP front"."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

#: the byte size of one element of each datatype the front lets through (BYTES: per element, see RequestLimits)
DATATYPE_BYTES = {"FP32": 4, "FP16": 2}
#: room in a request's JSON part for everything but its data (names, parameters, requested outputs)
JSON_SLACK = 64 * 2**10
#: bytes of JSON text one number of ``data`` may take (a float's shortest repr, a separator and a space)
JSON_BYTES_PER_NUMBER = 32
#: the largest JSON part read, whatever the model: a larger tensor travels as binary data (Triton's later releases
#: bound a whole request at 64 MiB by default, ``--http-max-input-size``)
JSON_MAX = 64 * 2**20


@dataclass(frozen=True)
class RequestLimits:
    """The one input a served model takes, as bounds. ``dims``: (smallest, largest) per dim, batch first;
    ``element_max``: the most bytes one element may carry (its datatype's size; for BYTES the 4-byte length and the
    largest encoded image)."""

    name: str
    datatype: str
    dims: tuple[tuple[int, int], ...]
    element_max: int
    #: how the shape is written in messages, e.g. ``[B, 3, H, W], B 1..64, H and W 1..1024 px``
    described: str

    @property
    def max_elements(self) -> int:
        return math.prod(hi for _, hi in self.dims)

    @property
    def max_json(self) -> int:
        """The largest JSON part of a valid request (its data written as JSON numbers), at most :data:`JSON_MAX`."""
        return min(JSON_MAX, JSON_SLACK + self.max_elements * JSON_BYTES_PER_NUMBER)

    @property
    def max_body(self) -> int:
        """The largest body of a valid request: a JSON part and its binary data."""
        return self.max_json + self.max_elements * self.element_max

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RequestLimits:
        fields = json.loads(text)
        return cls(**{**fields, "dims": tuple(tuple(d) for d in fields["dims"])})


def model_limits(
    name: str, datatype: str, dims: tuple[int, ...], max_batch: int, max_side: int | None, element_max: int
) -> RequestLimits:
    """The limits of a served input ``name`` of ``dims`` per request item (``-1``: any size up to ``max_side``
    pixels, ``--variable-size``) with up to ``max_batch`` items per request."""
    if -1 in dims and max_side is None:
        raise ValueError(f"{name} {list(dims)} has a variable size: give its largest side")
    bounds = tuple((1, max_side) if d == -1 else (d, d) for d in dims)
    shown = [("H" if i == 1 else "W") if d == -1 else str(d) for i, d in enumerate(dims)]
    described = f"{name} [B, {', '.join(shown)}] with B from 1 to {max_batch}"
    if max_side is not None:
        described += f", H and W from 1 to {max_side} px (--max-image-size)"
    return RequestLimits(name, datatype, ((1, max_batch), *bounds), element_max, described)


def _count_leaves(data: Any, want_strings: bool) -> tuple[int, int] | str:
    """(elements, string bytes) in a JSON ``data`` array, nested or flat, without recursion; or what is wrong."""
    count = text = 0
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict) or isinstance(item, str) != want_strings:
            return "its 'data' holds a value that is not " + ("a string" if want_strings else "a number")
        else:
            count += 1
            text += len(item.encode("utf-8", "surrogatepass")) if want_strings else 0
    return count, text


def _nonnegative(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shape_problem(shape: Any, limits: RequestLimits) -> str | None:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return f"its 'shape' must be a list of integers, got {json.dumps(shape)[:80]}"
    if len(shape) != len(limits.dims):
        return f"shape {shape} has {len(shape)} dims; this server takes {limits.described}"
    for i, (d, (lo, hi)) in enumerate(zip(shape, limits.dims, strict=True)):
        if d < 1:
            return f"shape {shape}: dim {i} is {d}, and every dim is at least 1; this server takes {limits.described}"
        if not lo <= d <= hi:
            return f"shape {shape}: dim {i} is {d}; this server takes {limits.described}"
    return None


def _data_problem(item: dict, elements: int, limits: RequestLimits) -> tuple[str | None, int]:
    """What is wrong with how ``item`` carries its ``elements`` (None when nothing), and its binary bytes."""
    params = item.get("parameters", {})
    if not isinstance(params, dict):
        return "its 'parameters' must be an object", 0
    ways = [w for w in ("data", "binary_data_size", "shared_memory_region") if w in (item if w == "data" else params)]
    if len(ways) != 1:
        return "it must carry its tensor one way: JSON 'data', 'binary_data_size' or 'shared_memory_region'", 0
    strings = limits.datatype == "BYTES"
    fixed = None if strings else elements * limits.element_max  # the exact bytes of a fixed-size datatype
    if ways == ["data"]:
        counted = _count_leaves(item["data"], strings) if isinstance(item["data"], list) else "its 'data' is no list"
        if isinstance(counted, str):
            return counted, 0
        if counted[0] != elements:
            return f"its shape declares {elements} elements and its 'data' holds {counted[0]}", 0
        return None, 0
    key = "binary_data_size" if ways == ["binary_data_size"] else "shared_memory_byte_size"
    size = params.get(key)
    if not _nonnegative(size):
        return f"its '{key}' must be an integer >= 0, got {json.dumps(size)[:40]}", 0
    if fixed is not None and size != fixed:
        return f"its shape declares {fixed} bytes ({elements} x {limits.datatype}) and its '{key}' {size}", 0
    if fixed is None and not 4 * elements <= size <= elements * limits.element_max:
        most = elements * limits.element_max
        return f"its '{key}' is {size} bytes, outside 4 x {elements} to {most} for {elements} element(s)", 0
    return None, size if key == "binary_data_size" else 0


def request_problem(header: bytes, binary_bytes: int, limits: RequestLimits) -> str | None:
    """Why Triton must not read an inference request whose JSON part is ``header`` and which carries
    ``binary_bytes`` after it (None: pass it on): not JSON, not the one input ``limits`` describes (name, datatype,
    shape within its bounds), or data that does not match its shape (JSON elements, ``binary_data_size`` or
    ``shared_memory_byte_size`` against elements x datatype size, the binary sizes against what follows the JSON)."""
    try:
        request = json.loads(header)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; RecursionError: nested too deep
        return 'the request is not JSON (KServe v2: {"inputs": [{"name", "shape", "datatype", ...}]})'
    inputs = request.get("inputs") if isinstance(request, dict) else None
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        return f"the request must carry one input in 'inputs'; this server takes {limits.described}"
    item = inputs[0]
    name = item.get("name")
    if name != limits.name:
        return f"input {json.dumps(name)[:60]} is not this model's; this server takes {limits.described}"
    where = f"input '{name}'"
    if item.get("datatype") != limits.datatype:
        return f"{where} is {json.dumps(item.get('datatype'))[:20]}; this server takes {limits.datatype}"
    problem = _shape_problem(item.get("shape"), limits)
    if problem is not None:
        return f"{where}: {problem}"
    problem, claimed = _data_problem(item, math.prod(item["shape"]), limits)
    if problem is not None:
        return f"{where}: {problem}"
    if claimed != binary_bytes:
        return f"{where}: its 'binary_data_size' is {claimed} bytes and {binary_bytes} follow the JSON part"
    return None


__all__ = [
    "DATATYPE_BYTES",
    "JSON_BYTES_PER_NUMBER",
    "JSON_MAX",
    "JSON_SLACK",
    "RequestLimits",
    "model_limits",
    "request_problem",
]
