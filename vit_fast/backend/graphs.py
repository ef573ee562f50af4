"""Replay a model's forward as one CUDA graph: :class:`CUDAGraphRunner`.

It captures one forward at a fixed input shape, dtype and device and replays it with one launch, so per-kernel CPU
launch overhead disappears; :func:`graph_input_mismatch` says why an input does not fit the capture. Usage and the
rules that come with graphs: docs/usage.md, "Replaying a forward as one CUDA graph"."""

from __future__ import annotations

from typing import Any

import torch


def graph_input_mismatch(x: Any, static: torch.Tensor) -> str | None:
    """Why ``x`` cannot be copied into the captured input ``static``, or None when it can.

    Pure tensor metadata: runs (and is tested) without a GPU.
    """
    if not isinstance(x, torch.Tensor):
        return f"expected a torch.Tensor, got {type(x).__name__}"
    problems = []
    if tuple(x.shape) != tuple(static.shape):
        if x.dim() == static.dim() and x.dim() > 0 and tuple(x.shape[1:]) == tuple(static.shape[1:]):
            problems.append(
                f"batch {x.shape[0]} differs from the captured batch {static.shape[0]} (a CUDA graph replays "
                f"fixed shapes: build one runner per batch size, or pad the batch to {static.shape[0]})"
            )
        else:
            problems.append(f"shape {tuple(x.shape)} differs from the captured shape {tuple(static.shape)}")
    if x.dtype != static.dtype:
        problems.append(f"dtype {x.dtype} differs from the captured dtype {static.dtype} (pass x.to({static.dtype}))")
    if x.device != static.device:
        problems.append(
            f"device {x.device} differs from the captured device {static.device} (pass x.to('{static.device}'))"
        )
    if not problems:
        return None
    return "CUDAGraphRunner input does not match the captured input: " + "; ".join(problems)


def _clone_tree(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_clone_tree(o) for o in out)
    if isinstance(out, list):
        return [_clone_tree(o) for o in out]
    if isinstance(out, dict):
        return {k: _clone_tree(v) for k, v in out.items()}
    return out


def require_cuda_graphs() -> None:
    """Raise a RuntimeError that says why CUDA graphs cannot be used here."""
    if not torch.cuda.is_available():
        built = torch.version.cuda
        if built is None:
            why = f"this torch build ({torch.__version__}) has no CUDA support"
        else:
            why = f"no CUDA GPU is visible (torch {torch.__version__}, CUDA {built})"
        raise RuntimeError(
            f"CUDA graphs need a GPU: {why}. Run the model eagerly on this machine (call the model directly)."
        )


class CUDAGraphRunner:
    """Capture ``model(example_input)`` as a CUDA graph; each call copies the input in and replays it. ``model``: any
    callable taking one CUDA tensor, its parameters kept where they are; ``example_input``: the shape, dtype and device
    of every later call; ``warmup``: eager calls before capture; ``pool``: a memory pool shared between runners.
    RuntimeError without a CUDA GPU, ValueError for an input that is not a CUDA tensor. See docs/usage.md, section
    "Replaying a forward as one CUDA graph"."""

    def __init__(self, model: Any, example_input: torch.Tensor, warmup: int = 3, pool: Any = None) -> None:
        require_cuda_graphs()
        if not isinstance(example_input, torch.Tensor):
            raise TypeError(f"example_input must be a torch.Tensor, got {type(example_input).__name__}")
        if not example_input.is_cuda:
            raise ValueError(
                f"example_input is on {example_input.device}; a CUDA graph captures CUDA tensors: "
                "pass example_input.cuda() (and keep the model on the same GPU)"
            )
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (lazy initialisation must not happen during capture), got {warmup}")
        self.model = model
        self.device = example_input.device
        self.static_input = example_input.detach().clone()
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(side):
                for _ in range(warmup):
                    model(self.static_input)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(self.graph, pool=pool):
                self.static_output = model(self.static_input)
            torch.cuda.synchronize()

    @property
    def batch_size(self) -> int:
        return int(self.static_input.shape[0])

    def check_input(self, x: Any) -> None:
        """Raise a ValueError (TypeError for a non-tensor) naming what differs from the captured input."""
        problem = graph_input_mismatch(x, self.static_input)
        if problem is not None:
            raise (TypeError if not isinstance(x, torch.Tensor) else ValueError)(problem)

    def replay(self) -> Any:
        """Replay on whatever the static input holds; returns the static output (overwritten by the next replay)."""
        self.graph.replay()
        return self.static_output

    def __call__(self, x: torch.Tensor) -> Any:
        self.check_input(x)
        self.static_input.copy_(x)
        self.graph.replay()
        return _clone_tree(self.static_output)

    def __repr__(self) -> str:
        return (
            f"CUDAGraphRunner(batch={self.batch_size}, shape={tuple(self.static_input.shape)}, "
            f"dtype={self.static_input.dtype}, device={self.device})"
        )


__all__ = ["CUDAGraphRunner", "graph_input_mismatch", "require_cuda_graphs"]
