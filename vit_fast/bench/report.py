"""What a benchmark run reports: the ratios filled into its rows, and the JSON, Markdown and PNG files.

``add_ratios`` sets each ok row next to the best peer at the same dtype and batch (``vs_best``) and
next to the physical floor (``vs_floor``); ``unavailable_summary`` lists what did not run and why;
``write_reports`` writes ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` atomically.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from vit_fast.files import write_atomic


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Fill achieved TFLOP/s, the ratio to the best peer (same dtype and batch) and to the floor."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        r["tflops"] = r["flops_per_image"] * r["batch"] / (r["median_ms"] * 1e-3) / 1e12
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
    lines = [
        f"# vit-fast bench: {report['model']}",
        "",
        f"- device: {env['device_name']} (driver {env['driver_version']}, CUDA runtime {env['cuda_runtime']})",
        f"- versions: torch {env['torch']}, triton {env['triton']}, onnxruntime {env['onnxruntime']}, "
        f"tensorrt {env['tensorrt']}, timm {env['timm']}, vit-fast {env['vit_fast']}",
        f"- commit: {env['git_commit']}; created {report['created_utc']}",
        f"- model: {cfg['embed_dim']}d x {cfg['depth']} blocks, {t.get('tokens', '?')} tokens, GELU {cfg['act']}, "
        f"{_fmt(t.get('params', 0) / 1e6, '.1f')} M params, {_fmt(t.get('flops_per_image', 0) / 1e9, '.2f')} "
        f"GFLOP/image",
        f"- timing: {t.get('timer', '?')}, warm-up {report['settings']['warmup']}, up to "
        f"{report['settings']['iters']} runs (capped at ~{report['settings']['max_seconds']} s per case), "
        f"L2 flush: {report['settings']['flush_l2'] or 'off'}",
    ]
    if report["settings"].get("threads"):
        lines.append(f"- CPU threads: {report['settings']['threads']} ({report['settings']['threads_note']})")
    if ceil.get("bandwidth"):
        lines.append(f"- measured bandwidth: {ceil['bandwidth']['GBps']:.1f} GB/s ({ceil['bandwidth']['method']})")
    for d, m in (ceil.get("matrix") or {}).items():
        lines.append(f"- measured matrix rate {d}: {m['TFLOPs']:.3g} TFLOP/s ({m['method']})")
    lines += [
        "",
        "Latencies in ms per batch (median, p90, p99). `x best` = median / fastest median at the same dtype and "
        "batch; `x floor` = median / max(weight bytes / bandwidth, FLOPs / matrix rate); `err` = max |output - "
        "torch backend output| on the same input (`torch err` = torch backend vs fp32).",
        "",
        "| backend | graph | dtype | batch | median | p90 | p99 | img/s | TFLOP/s | x best | floor ms | x floor "
        "| err | torch err |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("status") != "ok":
            continue
        graph = "-" if r["graph_mode"] == "none" else r["graph_mode"].split(" ")[0]
        best = _fmt(r.get("vs_best"), ".2f") + ("x" if r.get("vs_best") is not None else "")
        if r.get("vs_best") == 1.0:
            best = f"**{best}**"
        lines.append(
            f"| {r['label']} | {graph} | {r['dtype']} | {r['batch']} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} "
            f"| {r['p99_ms']:.3f} | {r['images_per_s']:.1f} | {_fmt(r.get('tflops'))} | {best} "
            f"| {_fmt(r.get('floor_ms'), '.3f')} ({(r.get('floor_bound') or '-')[:3]}) "
            f"| {_fmt(r.get('vs_floor'), '.1f')}x | {_fmt(r.get('max_abs_err_vs_torch'), '.2g')} "
            f"| {_fmt(r.get('torch_max_abs_err_vs_fp32'), '.2g')} |"
        )
    if not any(r.get("status") == "ok" for r in rows):
        lines.append("| (nothing ran) |||||||||||||| ")
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
    """PNG bytes: median latency and images/s against batch size, one line per backend and dtype."""
    import io

    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    fig, (ax_lat, ax_thr) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in report["rows"]:
        if r.get("status") == "ok":
            series.setdefault((r["label"], r["dtype"]), []).append(r)
    styles = ["-", "--", ":", "-."]
    dstyle = {d: styles[i % len(styles)] for i, d in enumerate(report["settings"]["dtypes"])}
    labels = sorted({label for label, _ in series})
    palette = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    color = {label: palette(i % palette.N) for i, label in enumerate(labels)}  # one colour per backend
    for (label, dtype), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["batch"])
        xs = [r["batch"] for r in rs]
        kw = {"marker": "o", "linestyle": dstyle.get(dtype, "-"), "color": color[label], "label": f"{label} {dtype}"}
        ax_lat.plot(xs, [r["median_ms"] for r in rs], **kw)
        ax_thr.plot(xs, [r["images_per_s"] for r in rs], **kw)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    batches = sorted(report["settings"]["batches"])
    for ax, ylabel, key in ((ax_lat, "median latency (ms)", "median_ms"), (ax_thr, "images / s", "images_per_s")):
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.xaxis.set_minor_locator(NullLocator())
        values = [r[key] for rs in series.values() for r in rs if r.get(key)]
        # a log axis only pays off over a decade or more; inside one it would show no tick labels at all
        if values and max(values) / min(values) >= 10:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_locator(NullLocator())
        ax.grid(True, alpha=0.3)
    if series:
        ax_thr.legend(fontsize=8, loc="best")
    else:
        ax_lat.text(0.5, 0.5, "no backend ran", ha="center", va="center", transform=ax_lat.transAxes)
    env = report["environment"]
    fig.suptitle(
        f"{report['model']} on {env['device_name'][:80]}  (torch {env['torch']}, {env['git_commit'][:12]})", fontsize=10
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


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


def write_reports(report: dict[str, Any], out_dir: Path, stem: str) -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` into ``out_dir`` atomically; returns the paths."""
    out_dir = Path(out_dir)
    paths = {
        "json": write_atomic(
            out_dir / f"{stem}.json", json.dumps(_json_clean(report), indent=2, default=_json_default) + "\n"
        ),
        "markdown": write_atomic(out_dir / f"{stem}.md", markdown_report(report)),
    }
    try:
        png = plot_report(report)
    except ImportError as err:  # matplotlib is an optional extra (vit-fast[bench])
        print(f"vit-fast bench: no plot written: {err} (pip install 'vit-fast[bench]')", file=sys.stderr)
    else:
        paths["png"] = write_atomic(out_dir / f"{stem}.png", png)
    return paths
