"""What a benchmark run reports: the ratios filled into its rows, and the JSON, Markdown, CSV and PNG files.

``add_ratios`` sets ``vs_best`` (against the best peer at the same dtype and batch) and ``vs_floor``;
``unavailable_summary`` lists what did not run and why; ``csv_report`` puts timm's columns first; ``write_reports``
writes the four files atomically, under a new stem beside an earlier run's. :class:`BenchResult`: the Python API's."""

from __future__ import annotations

import csv
import io
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vit_fast.backend.env import install_hint
from vit_fast.util.files import claim, json_text, make_folders, png_metadata, seal_markdown, seal_png, write_atomic
from vit_fast.util.progress import plural

REPORT_SUFFIXES = (".json", ".md", ".csv", ".png")
#: the CSV's columns: timm benchmark.py's inference columns (``infer_step_time`` = mean ms per batch,
#: ``infer_samples_per_sec`` = images per second at that mean, as timm computes them; ``param_count`` in millions,
#: ``infer_gmacs`` per image), then ours. Each throughput column names its statistic: ``median_images_per_s`` is
#: images per second at the median (the Markdown's ``img/s`` and the JSON rows' ``images_per_s``), so on a noisy
#: run it differs from timm's mean-based column by design
CSV_TIMM_COLUMNS = (
    "model",
    "infer_samples_per_sec",
    "infer_step_time",
    "infer_batch_size",
    "infer_img_size",
    "param_count",
    "infer_gmacs",
)
CSV_COLUMNS = (
    *CSV_TIMM_COLUMNS,
    "backend",
    "label",
    "graph_mode",
    "dtype",
    "status",
    "n",
    "stopped_by",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "p99_ms",
    "mean_ms",
    "min_ms",
    "max_ms",
    "std_ms",
    "median_images_per_s",
    "tflops",
    "vs_best",
    "vs_floor",
    "floor_ms",
    "max_abs_err_vs_torch",
    "threads",
    "device",
    "device_name",
    "weights",
    "torch",
    "onnxruntime",
    "tensorrt",
    "git_commit",
    "reason",
)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Fill achieved TFLOP/s, the ratio to the best peer (same dtype and batch) and to the floor."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        flops = r.get("flops_per_image")
        r["tflops"] = flops * r["batch"] / (r["median_ms"] * 1e-3) / 1e12 if flops else None
        r["vs_floor"] = r["median_ms"] / r["floor_ms"] if r.get("floor_ms") else None
        key = (r["dtype"], r["batch"])
        if key not in best or r["median_ms"] < best[key]["median_ms"]:
            best[key] = r
    for r in rows:
        if r.get("status") != "ok":
            continue
        b = best[(r["dtype"], r["batch"])]
        r["vs_best"] = r["median_ms"] / b["median_ms"]
        r["best_peer"] = b["label"]


def unavailable_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (label, status, reason) not run (unavailable, error, skipped), with its dtypes and batches."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r.get("status") == "ok":
            continue
        why = r.get("reason") or r.get("error") or ""
        key = (r["label"], r["status"], why)
        entry = seen.get(key)
        if entry is None:
            entry = {
                "backend": r["backend"],
                "label": r["label"],
                "status": r["status"],
                "reason": why,
                "dtypes": [],
                "batches": [],
            }
            seen[key] = entry
            out.append(entry)
        if r["dtype"] not in entry["dtypes"]:
            entry["dtypes"].append(r["dtype"])
        if r["batch"] not in entry["batches"]:
            entry["batches"].append(r["batch"])
    return out


def _fmt(v: Any, spec: str = ".3g", none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none if v is None else "nan"
    return format(v, spec)


def markdown_report(report: dict[str, Any]) -> str:
    """The report as Markdown: device, versions and ceilings, one table row per result that ran, the
    host-to-device copies, and every backend that did not run with the reason."""
    env, ceil, cfg = report["environment"], report["ceilings"], report["config"]
    rows = report["rows"]
    t = rows[0] if rows else {}
    st = report["settings"]
    params = t.get("params")
    flops = t.get("flops_per_image")
    tokens = plural(t["tokens"], "token") if t.get("tokens") else "? tokens"
    lines = [
        f"# vit-fast bench: {report['model']}",
        "",
        f"- device: {env['device_name']} (driver {env['driver_version']}, CUDA runtime {env['cuda_runtime']})",
        f"- versions: torch {env['torch']}, triton {env['triton']}, onnxruntime {env['onnxruntime']}, "
        f"tensorrt {env['tensorrt']}, timm {env['timm']}, vit-fast {env['vit_fast']}",
        f"- commit: {env['git_commit']}; created {report['created_utc']}",
        (
            f"- model: {cfg['embed_dim']}d x {plural(cfg['depth'], 'block')}, {tokens}, activation {cfg['act']}, "
            f"{_fmt(params / 1e6 if params else None, '.1f')} M params, "
            f"{_fmt(flops / 1e9 if flops else None, '.2f')} GFLOP/image"
            if cfg
            else "- model: no vit-fast metadata beside the artifact (architecture unknown)"
        ),
        f"- weights: {t.get('weights', 'not recorded')}",
        f"- timing: {t.get('timer', '?')}, warm-up {st['warmup']}; each case at least {st.get('min_samples', '?')} "
        f"runs and {st.get('min_time_s', '?')} s of them, at most {st['iters']} runs or ~{st['max_seconds']} s "
        f"(`n` = runs timed); L2 flush: {st['flush_l2'] or 'off'}",
    ]
    if report.get("complete") is False:  # a report written as the run goes, or one an interrupt cut
        cases = report.get("cases") or {}
        lines.insert(
            2,
            f"- **incomplete: {report['interrupted']}**; the rows below are the cases that finished"
            if report.get("interrupted")
            else f"- **in progress**: {cases.get('done', '?')} of {cases.get('total', '?')} cases done (this file is "
            "rewritten as each case ends)",
        )
    if st.get("triton_tuning"):
        lines.append(f"- triton backends: {st['triton_tuning']}")
    if report.get("artifact"):
        lines.append(f"- artifact: {report['artifact']} ({t.get('runtime', '?')}; verified: {t.get('verified')})")
    if st.get("threads"):
        lines.append(f"- CPU threads: {st['threads']} for every CPU backend ({st['threads_note']})")
    if ceil.get("not_measured"):
        lines.append(f"- floor: {ceil['not_measured']}")
    if ceil.get("bandwidth"):
        lines.append(f"- measured bandwidth: {ceil['bandwidth']['GBps']:.1f} GB/s ({ceil['bandwidth']['method']})")
    for d, m in (ceil.get("matrix") or {}).items():
        lines.append(f"- measured matrix rate {d}: {m['TFLOPs']:.3g} TFLOP/s ({m['method']})")
    lines += [
        "",
        "Latencies in ms per batch (median, p10, p90, p99 over `n` timed runs; a p99 over fewer than 100 runs is "
        "close to the maximum). `x best` = median / fastest median at the same dtype and "
        "batch; `x floor` = median / max(weight bytes / bandwidth, FLOPs / matrix rate); `err` = max |output - "
        "torch backend output| on the same input (`torch err` = torch backend vs fp32).",
        "",
        "| backend | graph | dtype | batch | median | p10 | p90 | p99 | n | img/s | TFLOP/s | x best | floor ms "
        "| x floor | err | torch err |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("status") != "ok":
            continue
        graph = "-" if r["graph_mode"] == "none" else r["graph_mode"].split(" ")[0]
        best = _fmt(r.get("vs_best"), ".2f") + ("x" if r.get("vs_best") is not None else "")
        if r.get("vs_best") == 1.0:
            best = f"**{best}**"
        lines.append(
            f"| {r['label']} | {graph} | {r['dtype']} | {r['batch']} | {r['median_ms']:.3f} | {r['p10_ms']:.3f} "
            f"| {r['p90_ms']:.3f} | {r['p99_ms']:.3f} | {r['n']} | {r['images_per_s']:.1f} | {_fmt(r.get('tflops'))} "
            f"| {best} "
            f"| {_fmt(r.get('floor_ms'), '.3f')} ({(r.get('floor_bound') or '-')[:3]}) "
            f"| {_fmt(r.get('vs_floor'), '.1f')}x | {_fmt(r.get('max_abs_err_vs_torch'), '.2g')} "
            f"| {_fmt(r.get('torch_max_abs_err_vs_fp32'), '.2g')} |"
        )
    if not any(r.get("status") == "ok" for r in rows):
        lines.append("| (nothing ran) |||||||||||||||| ")
    if report.get("transfers"):
        lines += [
            "",
            "Host-to-device copy of the input (timed apart from the forward):",
            "",
            "| dtype | batch | MB | median ms | GB/s |",
            "|---|---:|---:|---:|---:|",
        ]
        for tr in report["transfers"]:
            lines.append(
                f"| {tr['dtype']} | {tr['batch']} | {tr['bytes'] / 1e6:.2f} "
                f"| {_fmt(tr.get('median_ms'), '.4f')} | {_fmt(tr.get('GBps'), '.1f', tr.get('note', '-'))} |"
            )
    if report["unavailable"]:
        lines += ["", "Not run:", ""]
        for u in report["unavailable"]:
            lines.append(
                f"- **{u['label']}** ({','.join(u['dtypes'])}; batch {','.join(map(str, u['batches']))}): "
                f"{u['status']}: {u['reason']}"
            )
    return "\n".join(lines) + "\n"


def plot_report(report: dict[str, Any]) -> bytes:
    """PNG bytes of :func:`plot_figure`."""
    from matplotlib import pyplot as plt

    fig = plot_figure(report)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata=png_metadata(str(report.get("vit_fast_version") or "?")))
    plt.close(fig)
    return buf.getvalue()


#: room above the highest point of a panel (a factor on its value; a log axis gets its square): no point sits on
#: the frame
HEADROOM = 1.12


def plot_figure(report: dict[str, Any]) -> Any:
    """A matplotlib figure: latency (median, with a p10-p90 bar; the axis starts at 0) and images/s against
    batch size, one line per backend and dtype, or one bar each when the run has one batch size. Each panel
    leaves room above its highest point, and the legend sits below the panels, over no data."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    fig, (ax_lat, ax_thr) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in report["rows"]:
        if r.get("status") == "ok":
            series.setdefault((r["label"], r["dtype"]), []).append(r)
    labels = sorted({label for label, _ in series})
    palette = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    color = {label: palette(i % palette.N) for i, label in enumerate(labels)}  # one colour per backend
    batches = sorted({r["batch"] for rs in series.values() for r in rs} or set(report["settings"]["batches"]))

    def spread(rs: list[dict[str, Any]]) -> list[list[float]]:
        return [[r["median_ms"] - r["p10_ms"] for r in rs], [r["p90_ms"] - r["median_ms"] for r in rs]]

    if len(batches) == 1:  # one point per series: bars, not lines
        keys = sorted(series)
        xs = range(len(keys))
        rows = [series[k][0] for k in keys]
        colours = [color[k[0]] for k in keys]
        ax_lat.bar(xs, [r["median_ms"] for r in rows], yerr=spread(rows), capsize=4, color=colours)
        ax_thr.bar(xs, [r["images_per_s"] for r in rows], color=colours)  # bars start at 0
        for ax in (ax_lat, ax_thr):
            ax.set_xticks(list(xs), [f"{label}\n{dtype}" for label, dtype in keys], fontsize=8)
            ax.set_xlabel(f"backend (batch {batches[0]})")
    else:
        styles = ["-", "--", ":", "-."]
        dstyle = {d: styles[i % len(styles)] for i, d in enumerate(report["settings"]["dtypes"])}
        for (label, dtype), rs in sorted(series.items()):
            rs = sorted(rs, key=lambda r: r["batch"])
            xs = [r["batch"] for r in rs]
            kw = {
                "marker": "o",
                "linestyle": dstyle.get(dtype, "-"),
                "color": color[label],
                "label": f"{label} {dtype}",
            }
            ax_lat.errorbar(xs, [r["median_ms"] for r in rs], yerr=spread(rs), capsize=3, **kw)
            ax_thr.plot(xs, [r["images_per_s"] for r in rs], **kw)
        for ax in (ax_lat, ax_thr):
            ax.set_xlabel("batch size")
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.xaxis.set_minor_locator(NullLocator())
        values = [r["images_per_s"] for rs in series.values() for r in rs]
        # a log axis only pays off over a decade or more; inside one it would show no tick labels at all
        if values and max(values) / min(values) >= 10:
            ax_thr.set_yscale("log")
            ax_thr.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax_thr.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax_thr.yaxis.set_minor_locator(NullLocator())
            ax_thr.set_ylim(min(values) / HEADROOM**2, max(values) * HEADROOM**2)
        elif values:
            ax_thr.set_ylim(0, max(values) * HEADROOM)
    ax_lat.set_ylabel("latency per batch (ms): median, bar p10-p90")
    highest = [r["p90_ms"] for rs in series.values() for r in rs]
    ax_lat.set_ylim(0, max(highest) * HEADROOM if highest else None)  # from 0, so the bars and gaps read true
    if len(batches) == 1 and series:
        ax_thr.set_ylim(0, max(series[k][0]["images_per_s"] for k in series) * HEADROOM)
    ax_thr.set_ylabel("images / s")
    for ax in (ax_lat, ax_thr):
        ax.grid(True, alpha=0.3)
    if not series:
        ax_lat.text(0.5, 0.5, "no backend ran", ha="center", va="center", transform=ax_lat.transAxes)
    env = report["environment"]
    fig.suptitle(
        f"{report['model']} on {env['device_name'][:80]}  (torch {env['torch']}, {env['git_commit'][:12]})", fontsize=10
    )
    handles, names = ax_thr.get_legend_handles_labels()
    if handles:  # below both panels, where it covers no point
        columns = min(len(handles), 4)
        rows = -(-len(handles) // columns)
        fig.legend(handles, names, loc="lower center", ncol=columns, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.045 * rows + 0.01, 1, 1))
    else:
        fig.tight_layout()
    return fig


def csv_report(report: dict[str, Any]) -> str:
    """The rows as CSV: timm benchmark.py's inference columns where they apply (from the mean, as timm's), then ours
    (:data:`CSV_COLUMNS`; throughput from the median as ``median_images_per_s``)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in report["rows"]:
        ok = r.get("status") == "ok"
        img = r.get("img_size")
        timm = {
            "infer_samples_per_sec": round(r["batch"] / (r["mean_ms"] * 1e-3), 2) if ok else None,
            "infer_step_time": round(r["mean_ms"], 3) if ok else None,
            "infer_batch_size": r["batch"],
            "infer_img_size": img[-1] if img else None,
            "param_count": round(r["params"] / 1e6, 2) if r.get("params") else None,
            "infer_gmacs": round(r["flops_per_image"] / 2e9, 2) if r.get("flops_per_image") else None,
        }
        ours = {"median_images_per_s": r.get("images_per_s"), "reason": r.get("reason") or r.get("error")}
        row = {**r, **timm, **ours}
        writer.writerow({k: _csv_value(row.get(k)) for k in CSV_COLUMNS})
    return out.getvalue()


def _csv_value(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    return v


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.dtype):
        return str(obj)
    return repr(obj)


def _json_clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # "nan" / "inf": visible, and still valid JSON
    if isinstance(obj, dict):
        return {k: _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_clean(v) for v in obj]
    return obj


def free_stem(out_dir: Path, stem: str, run_id: str, overwrite: bool = False) -> str:
    """``stem`` when no ``<stem>.{json,md,csv,png}`` is in ``out_dir`` yet (or ``overwrite``), else
    ``<stem>-<run_id>`` (``-2``, ``-3`` ... after it if even that is taken): a run never replaces another's."""

    def taken(s: str) -> bool:
        return any(os.path.lexists(out_dir / f"{s}{suffix}") for suffix in REPORT_SUFFIXES)

    if overwrite or not taken(stem):
        return stem
    candidate, n = f"{stem}-{run_id}", 2
    while taken(candidate):
        candidate, n = f"{stem}-{run_id}-{n}", n + 1
    return candidate


def write_reports(
    report: dict[str, Any], out_dir: Path, stem: str, overwrite: bool = False, png: bool = True
) -> dict[str, Path]:
    """Write ``<stem>.json``, ``.md``, ``.csv`` and ``.png`` (not with ``png=False``) into ``out_dir`` atomically
    (``out_dir`` is made); returns the paths by kind. An earlier run's files are kept and this run's named apart
    (:func:`free_stem`) unless ``overwrite``; the names are claimed (:func:`vit_fast.util.files.claim`), so a file that
    appears under one before it is written is never replaced. The JSON, Markdown and PNG carry vit-fast's seal
    (``vit_fast.util.files``)."""
    out_dir = make_folders(out_dir, "bench output folder")
    stem = free_stem(out_dir, stem, report.get("run_id") or "run", overwrite)
    for suffix in REPORT_SUFFIXES:
        claim(out_dir / f"{stem}{suffix}", overwrite=overwrite)
    version = str(report.get("vit_fast_version") or "?")
    paths = {
        "json": write_atomic(
            out_dir / f"{stem}.json", json_text(_json_clean(report), sort_keys=False, default=_json_default)
        ),
        "markdown": write_atomic(out_dir / f"{stem}.md", seal_markdown(markdown_report(report), version)),
        "csv": write_atomic(out_dir / f"{stem}.csv", csv_report(report)),
    }
    if not png:
        return paths
    try:
        picture = plot_report(report)
    except ImportError as err:  # matplotlib comes with the bench extra
        print(f"vit-fast bench: no plot written: {err} ({install_hint('bench')})", file=sys.stderr)
    else:
        paths["png"] = write_atomic(out_dir / f"{stem}.png", seal_png(picture))
    return paths


def model_slug(spec: str) -> str:
    """A file-name stem for a model spec: a preset or hub name as it is, a checkpoint file by its stem, a folder
    (a Hugging Face save_pretrained folder) by its own name, never by the path leading to it."""
    path = Path(spec)
    if spec.startswith(("hf:", "timm:")):  # a hub name, tag and organisation included
        stem = spec
    elif path.is_dir() or (not path.suffix and "/" in spec):
        stem = path.name
    elif path.suffix:
        stem = path.stem
    else:
        stem = spec
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_") or "model"


@dataclass
class BenchResult:
    """What :func:`vit_fast.bench.benchmark` returns: the report, its rows, and its text forms; nothing is
    written until :meth:`write` is called."""

    report: dict[str, Any]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per backend, dtype and batch (``status`` ok, unavailable, error or skipped)."""
        return self.report["rows"]

    def ok(self) -> list[dict[str, Any]]:
        """The rows that were timed."""
        return [r for r in self.rows if r.get("status") == "ok"]

    def markdown(self) -> str:
        return markdown_report(self.report)

    def csv(self) -> str:
        return csv_report(self.report)

    def write(self, out_dir: str | Path, stem: str | None = None, overwrite: bool = False) -> dict[str, Path]:
        """Write the JSON, Markdown, CSV and PNG files (see :func:`write_reports`); returns their paths. ``stem``
        defaults to ``bench_<model>``, as the command line names them."""
        stem = stem or f"bench_{model_slug(str(self.report['model']))}"
        return write_reports(self.report, Path(out_dir), stem, overwrite)

    def __iter__(self):  # noqa: D105
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)
