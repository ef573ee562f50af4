"""The demo's pictures as PNG files: patches.png, attention.png, confusion.png, timing.png. The data behind each
is computed here or taken from the demo's report; every ``draw_*`` returns PNG bytes, and matplotlib (the ``demo``
extra) is imported inside them, never when vit_fast is imported. Each picture: docs/cli.md."""

from __future__ import annotations

import importlib.util
import io
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vit_fast.backend.env import install_hint
from vit_fast.util.files import png_metadata, seal_png, write_atomic

#: dots per inch of every picture; the sizes below are in inches, so a picture is SIZES_IN * DPI pixels
DPI = 110
SIZES_IN: dict[str, tuple[float, float]] = {
    "patches": (13.0, 9.4),
    "attention": (10.0, 8.4),
    "confusion": (6.6, 5.8),
    "timing": (10.0, 4.6),
}
FILES = {name: f"{name}.png" for name in SIZES_IN}
#: report.md's line under each picture
CAPTIONS = {
    "patches": "Held-out digits at model resolution, cut into the patch grid (each grid row's token numbers at its "
    "left), and the sequence of tokens the model reads: the class token, then each patch's pixels, row by row.",
    "attention": "The class token's attention over the patches in the last block, per head and averaged "
    "(torch backend: the fused Triton kernel never forms these probabilities).",
    "confusion": "Held-out predictions of the torch backend against the true digits.",
    "timing": "The timing step's numbers: median per call, whiskers from p10 to p90.",
}
#: the held-out digits drawn in patches.png and attention.png: the first held-out image of each of these labels
SHOWN_DIGITS = (0, 4, 7)
#: colour of the class token wherever it is drawn
CLS_COLOR = "tab:orange"
#: colour of the one patch followed from the image into the sequence in patches.png
PICK_COLOR = "deepskyblue"
#: display names of the timing step's backends, in bar order
BACKEND_NAMES = {"torch": "torch (eager)", "onnxruntime": "ONNX Runtime"}
BACKEND_COLORS = {"torch": "tab:blue", "onnxruntime": "tab:green"}
#: timing.png switches a panel to a log axis when its p90 / p10 spread exceeds this
LOG_SPREAD = 10.0


def matplotlib_missing() -> str | None:
    """None when matplotlib can be imported, else the one-line note the demo reports instead of pictures."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"matplotlib is not installed, so no pictures were drawn: {install_hint('demo')}"
    return None


# --------------------------------------------------------------------------- the data behind the pictures
def pick_examples(labels: torch.Tensor, digits: tuple[int, ...] = SHOWN_DIGITS) -> list[int]:
    """Indices into ``labels`` ``[N]`` of the first image of each digit in ``digits`` (ValueError if one is absent)."""
    found = []
    for digit in digits:
        hits = (labels == digit).nonzero().flatten()
        if not len(hits):
            raise ValueError(f"no held-out image has label {digit}")
        found.append(int(hits[0]))
    return found


def patch_sequence(image: np.ndarray, patch: int) -> np.ndarray:
    """One channel ``[H, W]`` cut into its patches ``[H/p * W/p, p, p]`` in token order (row by row, left to
    right): the order of the patch embedding's ``flatten(2)``, which the tests check against the model."""
    h, w = image.shape
    gh, gw = h // patch, w // patch
    return (
        image[: gh * patch, : gw * patch].reshape(gh, patch, gw, patch).transpose(0, 2, 1, 3).reshape(-1, patch, patch)
    )


def class_token_attention(model: Any, images: torch.Tensor) -> torch.Tensor:
    """The class token's attention ``[B, heads, T]`` over all T tokens (itself first, then the patches row by row) in
    the model's last block; each row sums to 1. Runs the model once on the torch backend (set for the call, then
    restored) with a forward hook on the last block's attention module that keeps its input; the probabilities are
    recomputed from that input, so the model's forward is the one everybody runs. A ValueError without a class
    token."""
    if not model.cfg.class_token:
        raise ValueError("the model has no class token, so there is no class-token attention to draw")
    attn = model.blocks[-1].attn
    inputs: list[torch.Tensor] = []
    handle = attn.register_forward_hook(lambda module, args, output: inputs.append(args[0]))
    previous = model.backend
    try:
        with torch.no_grad():
            model.set_backend("torch")(images)
            probs = attn.probabilities(inputs[0])
    finally:
        handle.remove()
        model.backend = previous  # set_backend(previous) would re-check what was checked when it was set
    return probs[:, :, 0, :]


def confusion_matrix(labels: torch.Tensor, predictions: torch.Tensor, num_classes: int) -> np.ndarray:
    """Counts ``[num_classes, num_classes]`` int64: row = true label, column = predicted label."""
    flat = labels.long() * num_classes + predictions.long()
    return torch.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes).numpy()


def timing_bars(timing: dict[str, Any]) -> list[dict[str, Any]]:
    """One bar per (batch, backend) of the demo's timing step, with the numbers report.json holds for it."""
    bars = []
    for batch, row in timing["cases"].items():
        for backend, stats in row.items():
            bar = {"batch": int(batch), "backend": backend, "n": stats["n"]}
            bars.append(bar | {k: stats[k] for k in ("median_ms", "p10_ms", "p90_ms")})
    return bars


# --------------------------------------------------------------------------- drawing
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only: no display, whatever backend the user's set-up picks
    from matplotlib import pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    from vit_fast import __version__

    # no bbox_inches="tight": the size stays SIZES_IN * DPI; the digest chunk is the proof vit-fast drew it
    fig.savefig(buf, format="png", dpi=DPI, metadata=png_metadata(__version__))
    _pyplot().close(fig)
    return seal_png(buf.getvalue())


def png_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` in pixels from a PNG's header (ValueError when ``data`` is not a PNG)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


def _outlined(**kw: Any) -> dict[str, Any]:
    """Text keyword arguments for black text in a white halo: readable on paper and on ink alike."""
    from matplotlib import patheffects

    return {"color": "black", "path_effects": [patheffects.withStroke(linewidth=1.8, foreground="white")], **kw}


def draw_patches(images: np.ndarray, patch: int, titles: list[str]) -> bytes:
    """Per image ``[N, H, W]`` (model input values), left to right: the image with its patch grid, each grid
    row's token numbers at its left and the columns below (none over the pixels); its patch with the most
    contrast, magnified, its pixels numbered in the order they are flattened; the token sequence the model
    reads, one column per token (the class token, then each patch's p*p values)."""
    plt = _pyplot()
    n, h, w = images.shape
    gh, gw = h // patch, w // patch
    tokens, values = 1 + gh * gw, patch * patch
    vmin, vmax = float(images.min()), float(images.max())
    cmap = plt.get_cmap("gray_r").with_extremes(bad="white")  # NaN: the class token's column, drawn over
    fig = plt.figure(figsize=SIZES_IN["patches"])
    grid = fig.add_gridspec(n, 4, width_ratios=[2.2, 1.0, 7.2, 0.13])
    grid.update(left=0.055, right=0.93, top=0.88, bottom=0.07, hspace=0.42, wspace=0.2)
    fig.suptitle(
        f"How an image enters the model: {h}x{w} pixels cut into a {gh}x{gw} grid of {patch}x{patch} patches, read "
        f"as a sequence of {tokens} tokens:\ntoken 0 is the class token (a learned vector, no pixels), then the "
        f"patches row by row, left to right; each patch's {values} pixels, flattened, are what the patch "
        "embedding projects",
        fontsize=10.5,
    )
    shown = None
    for i in range(n):
        seq = patch_sequence(images[i], patch)  # [tokens - 1, p, p]
        pick = int(seq.reshape(tokens - 1, -1).std(axis=1).argmax())  # the patch with most contrast: token pick + 1
        r0, c0 = divmod(pick, gw)

        ax = fig.add_subplot(grid[i, 0])
        ax.imshow(images[i], cmap="gray_r", vmin=vmin, vmax=vmax, extent=(0, w, h, 0))
        for x in range(0, w + 1, patch):
            ax.axvline(x, color=CLS_COLOR, linewidth=0.7)
        for y in range(0, h + 1, patch):
            ax.axhline(y, color=CLS_COLOR, linewidth=0.7)
        ax.add_patch(plt.Rectangle((c0 * patch, r0 * patch), patch, patch, fill=False, color=PICK_COLOR, lw=2.2))
        # token numbers outside the picture, so they cover no pixel: each grid row's tokens at its left, the
        # column at the bottom (token = the row's first + column - 1)
        centres = [patch * (k + 0.5) for k in range(max(gh, gw))]
        ax.set_yticks(centres[:gh], [f"{1 + r * gw}-{(r + 1) * gw}" for r in range(gh)], fontsize=6.5)
        ax.set_xticks(centres[:gw], [str(c + 1) for c in range(gw)], fontsize=6.5)
        ax.tick_params(length=0, pad=1.5)
        ax.set_ylabel("tokens in the row", fontsize=7, labelpad=1)
        ax.set_xlabel("column", fontsize=7, labelpad=1)
        ax.set_title(titles[i], fontsize=9)

        ax_zoom = fig.add_subplot(grid[i, 1])
        ax_zoom.imshow(seq[pick], cmap="gray_r", vmin=vmin, vmax=vmax)
        for k in range(values):
            ax_zoom.text(k % patch, k // patch, str(k + 1), ha="center", va="center", **_outlined(fontsize=7.5))
        for side in ax_zoom.spines.values():
            side.set(color=PICK_COLOR, linewidth=2.2)
        ax_zoom.set_xticks([])
        ax_zoom.set_yticks([])
        ax_zoom.set_title(f"token {pick + 1}, magnified:\npixels read 1..{values}", fontsize=8.5)

        flat = np.full((values, tokens), np.nan)
        flat[:, 1:] = seq.reshape(tokens - 1, -1).T
        ax_seq = fig.add_subplot(grid[i, 2])
        shown = ax_seq.imshow(flat, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
        ax_seq.add_patch(plt.Rectangle((-0.5, -0.5), 1, values, color=CLS_COLOR))
        ax_seq.text(0, values / 2 - 0.5, "class token", rotation=90, ha="center", va="center", fontsize=7)
        ax_seq.add_patch(plt.Rectangle((pick + 0.5, -0.5), 1, values, fill=False, color=PICK_COLOR, lw=2.2))
        for r in range(gh):  # which grid row each run of tokens came from
            x0, x1 = r * gw + 0.5, (r + 1) * gw + 0.5
            ax_seq.plot([x0 + 0.15, x1 - 0.15], [-1.0, -1.0], color="0.35", lw=1, clip_on=False)
            ax_seq.annotate(
                f"grid row {r + 1}",
                ((x0 + x1) / 2, -1.0),
                xytext=(0, 1.5),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
                annotation_clip=False,
            )
        ax_seq.spines["top"].set_visible(False)
        ticks = [0, *range(1, tokens, gw), tokens - 1]
        ax_seq.set_xticks(ticks, [str(t) for t in ticks], fontsize=7.5)
        ax_seq.set_yticks([0, values - 1], ["1", str(values)], fontsize=7.5)
        ax_seq.set_ylabel("pixel in patch", fontsize=8)
        ax_seq.set_xlabel("token index (one column = one token)", fontsize=8.5)
    cax = fig.add_subplot(grid[:, 3])
    fig.colorbar(shown, cax=cax).set_label("model input value (normalised pixel; dark = ink)", fontsize=9)
    cax.tick_params(labelsize=8)
    return _png(fig)


def draw_attention(
    images: np.ndarray, cls_attention: np.ndarray, grid: tuple[int, int], titles: list[str], block: str
) -> bytes:
    """Per image ``[N, H, W]``: the image, then the class token's attention ``[N, heads, 1 + gh*gw]`` to each
    patch per head and averaged over heads, as a heat map on the patch grid with the digit's outline on top."""
    plt = _pyplot()
    from matplotlib.colors import PowerNorm

    n, h, w = images.shape
    heads = cls_attention.shape[1]
    maps = np.concatenate([cls_attention, cls_attention.mean(axis=1, keepdims=True)], axis=1)  # [N, heads+1, T]
    names = [f"head {j + 1}" for j in range(heads)] + [f"mean of {heads} heads"]
    fig, axes = plt.subplots(n, heads + 2, figsize=SIZES_IN["attention"], squeeze=False)
    fig.subplots_adjust(left=0.03, right=0.9, top=0.86, bottom=0.03, wspace=0.12, hspace=0.32)
    fig.suptitle(
        f"Where the class token looks in the last block ({block}): its attention weight on each patch\n"
        "computed on the torch backend, which forms these probabilities; the fused Triton kernel never does.\n"
        f"Each panel's weights on the {grid[0] * grid[1]} patches plus the class token itself sum to 1.",
        fontsize=10.5,
    )
    for i in range(n):
        axes[i, 0].imshow(images[i], cmap="gray_r")
        axes[i, 0].set_title(titles[i], fontsize=9)
        top = float(maps[i, :, 1:].max())
        level = (float(images[i].min()) + float(images[i].max())) / 2
        for j in range(heads + 1):
            ax = axes[i, j + 1]
            heat = maps[i, j, 1:].reshape(grid)
            # a square-root colour scale: a few patches take most of the weight, and the rest still shows
            norm = PowerNorm(gamma=0.5, vmin=0, vmax=top)
            im = ax.imshow(heat, cmap="magma", norm=norm, extent=(0, w, h, 0), interpolation="nearest")
            ax.contour(np.arange(w) + 0.5, np.arange(h) + 0.5, images[i], levels=[level], colors="cyan", linewidths=1.0)
            ax.set_title(f"{names[j]}\n(on the class token itself: {maps[i, j, 0]:.3f})", fontsize=8.5)
        box = axes[i, -1].get_position()
        cax = fig.add_axes((box.x1 + 0.012, box.y0, 0.014, box.height))
        ticks = top * np.linspace(0, 1, 5) ** 2  # evenly spaced on the square-root scale
        bar = fig.colorbar(im, cax=cax, ticks=ticks, format="{x:.2g}")
        bar.set_label("attention weight (square-root scale)", fontsize=8)
        cax.tick_params(labelsize=7.5)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.text(
        0.5,
        0.005,
        "cyan line: the digit's outline (half-way between the image's darkest and lightest pixel)",
        ha="center",
        va="bottom",
        fontsize=8.5,
    )
    return _png(fig)


def draw_confusion(matrix: np.ndarray, accuracy: float, backend: str) -> bytes:
    """The confusion matrix ``[C, C]`` (rows: true label, columns: predicted) with every non-zero count written
    in its cell; mistakes (off the diagonal) in red."""
    plt = _pyplot()
    classes = matrix.shape[0]
    total, correct = int(matrix.sum()), int(np.trace(matrix))
    fig, ax = plt.subplots(figsize=SIZES_IN["confusion"], layout="constrained")
    im = ax.imshow(matrix, cmap="Blues", vmin=0)
    for r in range(classes):
        for c in range(classes):
            if matrix[r, c]:
                dark = matrix[r, c] > matrix.max() / 2
                color = ("white" if dark else "black") if r == c else "red"
                weight = "normal" if r == c else "bold"
                ax.text(c, r, str(matrix[r, c]), ha="center", va="center", color=color, fontsize=9, weight=weight)
    ax.set_xticks(range(classes))
    ax.set_yticks(range(classes))
    ax.set_xlabel("predicted digit")
    ax.set_ylabel("true digit")
    ax.set_title(
        f"Held-out confusion matrix, {backend} backend\naccuracy {accuracy:.2%} ({correct} of {total} images; "
        "mistakes in red)",
        fontsize=10.5,
    )
    fig.colorbar(im, ax=ax, shrink=0.9).set_label("images")
    return _png(fig)


def draw_timing(bars: list[dict[str, Any]], clock: str, threads: int) -> bytes:
    """One panel per batch size: a bar per backend at its median, whiskers from p10 to p90 (ms per batch)."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    batches = sorted({b["batch"] for b in bars})
    fig, axes = plt.subplots(1, len(batches), figsize=SIZES_IN["timing"], squeeze=False)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.8, bottom=0.12, wspace=0.3)
    fig.suptitle(
        f"Backend timings: {clock}, {threads} thread{'' if threads == 1 else 's'} each. Bars: median; whiskers: p10 "
        "to p90 of the timed runs.\nThe same numbers as the report's timing step; shorter is faster.",
        fontsize=10.5,
    )
    for ax, batch in zip(axes[0], batches, strict=True):
        order = {name: i for i, name in enumerate(BACKEND_NAMES)}  # known backends first, in their order
        row = sorted(
            (b for b in bars if b["batch"] == batch), key=lambda b: (order.get(b["backend"], 99), b["backend"])
        )
        x = np.arange(len(row))
        med = np.array([b["median_ms"] for b in row])
        spread = np.array([[b["median_ms"] - b["p10_ms"] for b in row], [b["p90_ms"] - b["median_ms"] for b in row]])
        colors = [BACKEND_COLORS.get(b["backend"], "tab:gray") for b in row]
        ax.bar(x, med, width=0.55, color=colors, yerr=spread, capsize=6, error_kw={"linewidth": 1.2})
        for xi, b in zip(x, row, strict=True):
            label = f"{b['median_ms']:.2f} ms"  # as the table prints it
            ax.annotate(
                label,
                (xi, b["p90_ms"]),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=9,
            )
        ax.set_xticks(x, [BACKEND_NAMES.get(b["backend"], b["backend"]) for b in row], fontsize=9.5)
        low, high = min(b["p10_ms"] for b in row), max(b["p90_ms"] for b in row)
        if high / low > LOG_SPREAD:  # a busy machine: a linear axis would show whiskers and no bars
            ax.set_yscale("log")
            ax.set_ylim(low / 2, high * 2.2)
            ax.set_ylabel("time per call (ms, log scale)")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        else:
            ax.set_ylim(0, 1.18 * high)
            ax.set_ylabel("time per call (ms)")
        runs = "/".join(sorted({str(b["n"]) for b in row}))
        title = f"batch {batch} ({runs} runs each)"
        if len(row) == 2 and min(b["median_ms"] for b in row) > 0:  # which of the two is faster, by how much
            fast, slow = sorted(row, key=lambda b: b["median_ms"])
            name = BACKEND_NAMES.get(fast["backend"], fast["backend"])
            title += f":\n{name} {slow['median_ms'] / fast['median_ms']:.2f}x faster (median)"
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    return _png(fig)


# --------------------------------------------------------------------------- the demo's figure step
def _title(label: int, prediction: int, index: int) -> str:
    return f"held-out #{index}: label {label}, predicted {prediction}"


def write_figures(
    out_dir: Path,
    model: Any,
    images: torch.Tensor,
    labels: torch.Tensor,
    predictions: torch.Tensor,
    accuracy: float,
    timing: dict[str, Any] | None,
) -> dict[str, dict[str, Any]]:
    """Draw the four pictures into ``out_dir``; returns, per picture, ``{"file", "width_px", "height_px",
    "data"}`` with the numbers it shows, or ``{"file": None, "skipped": why}`` (timing.png when the timing step
    did not run). ``images`` ``[N, 1, H, W]`` model inputs, ``labels`` / ``predictions`` ``[N]`` (the torch
    backend's), ``accuracy`` the accuracy step's, ``timing`` the timing step's record."""
    out_dir = Path(out_dir)
    cfg = model.cfg
    shown = pick_examples(labels)
    pixels = images[shown, 0].numpy()
    titles = [_title(int(labels[k]), int(predictions[k]), k) for k in shown]
    cls_attention = class_token_attention(model, images[shown]).numpy()
    matrix = confusion_matrix(labels, predictions, cfg.num_classes)
    block = f"block {cfg.depth} of {cfg.depth}"
    drawn = {
        "patches": (
            draw_patches(pixels, cfg.patch_size, titles),
            {
                "images": shown,
                "patch_size": cfg.patch_size,
                "grid": list(cfg.grid_size),
                "tokens": cfg.num_tokens,
                "order": "class token, then patches row by row",
            },
        ),
        "attention": (
            draw_attention(pixels, cls_attention, cfg.grid_size, titles, block),
            {
                "images": shown,
                "block_index": cfg.depth - 1,  # counted from 0: the last block
                "backend": "torch",
                "class_token_attention": cls_attention.tolist(),
            },
        ),
        "confusion": (
            draw_confusion(matrix, accuracy, "torch"),
            {"matrix": matrix.tolist(), "accuracy": accuracy, "images": int(matrix.sum())},
        ),
    }
    figures: dict[str, dict[str, Any]] = {}
    if timing is not None and timing.get("status") == "ok":
        bars = timing_bars(timing)
        drawn["timing"] = (draw_timing(bars, timing["clock"], timing["threads"]), {"bars": bars})
    else:
        why = "the timing step did not run" if timing is None else f"the timing step is {timing.get('status')}"
        figures["timing"] = {"file": None, "skipped": why}
    for name, (png, data) in drawn.items():
        write_atomic(out_dir / FILES[name], png)
        width, height = png_size(png)
        figures[name] = {"file": FILES[name], "width_px": width, "height_px": height, "data": data}
    return {name: figures[name] for name in FILES}
