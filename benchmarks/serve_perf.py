"""perf_analyzer against `vit-fast serve` and against a plain PyTriton script serving the same weights, side by side.

    python benchmarks/serve_perf.py --perf-analyzer .tools/perf_analyzer/perf_analyzer      (`make serve-bench`)
        [--concurrency 1,2,4,8,16] [--batch 1,8] [--protocols grpc,http] [--interval-ms 3000] [--repeats 1]
        [--json PATH] [--images PATH... [--write-input-data FILE]]

With --images (files or folders; the first 64 images, `make serve-bench-images IMAGES=...`) only `vit-fast serve
default --encoded` is measured (the plain script takes no encoded images, and a plain state dict carries no
preprocessing): perf_analyzer sends those files, read from an
--input-data JSON file that holds each one base64-encoded as one BYTES element of image_bytes (perf_analyzer's
"Real Input Data"). --write-input-data FILE writes that JSON file and stops, for perf_analyzer runs by hand.

Both servers start once, each on its own loopback ports, from one file: the embedded default model's weights
written as a plain safetensors state dict with its config.json (`vit-fast serve W --config C`;
benchmarks/plain_pytriton.py W C). NVIDIA's perf_analyzer, unmodified and without a token, measures each point
(protocol, batch, concurrency) on one server and then the other, the order alternating point by point; the
machine's load average is recorded beside every point. With --repeats N each point is measured N times on each
side (the two sides alternating: A B A B ...) and the table shows each side's median inferences/s, with the p50, p99
and load of that median run, and the lowest and highest ratio of one run to the other side's run beside it: one
point moves by up to about 10 % between runs on a 2-core machine, so one run says little. perf_analyzer is
asked for 3 trials within 100 % of each other (--stability-percentage 100, at most 10 trials): with 25 % it gave
up on most points of a 2-core machine whose load average was 16-23 (other jobs). Prints a Markdown table of
inferences/s and p50/p99 latency with vit-fast's ratio to the plain script (throughput: higher is better; p99:
ours / plain, lower is better), and writes every figure to --json. Not a test: the figures depend on the machine
and what else runs on it.
Get perf_analyzer with benchmarks/get_perf_analyzer.sh (`make perf-analyzer`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # script_args beside this script, however it is loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))

HERE = Path(__file__).resolve().parent
MODEL = "default"
READY_TIMEOUT_S = 300


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_weights(folder: Path) -> tuple[Path, Path]:
    """The default model as a plain state dict and its config.json, the one file both servers load."""
    from safetensors.torch import save

    import vit_fast
    from vit_fast.util.files import write_new

    model = vit_fast.load_model("default", backend="torch")
    weights, config = folder / "default.safetensors", folder / "config.json"
    write_new(weights, save({k: v.contiguous() for k, v in model.state_dict().items()}))
    write_new(config, json.dumps(model.cfg.to_dict()))
    return weights, config


def start(name: str, cmd: list[str], ports: list[int], log: Path, threads: int | None = None) -> subprocess.Popen:
    # The plain script needs by hand what vit-fast serve does itself: this interpreter's libpython first on
    # LD_LIBRARY_PATH, or Triton's python-backend stub loads the system's (here 3.11.2 beside pyenv's 3.11.7) and
    # the model fails to load ('_thread.RLock' object has no attribute '_recursion_count')
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH")) if p))
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    from vit_fast.util.files import open_new

    with open_new(log) as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{ports[0]}/v2/models/{MODEL}/ready"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"{name} did not become ready; its log ends:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)


def write_input_data(paths: list[str], path: Path) -> int:
    """perf_analyzer's --input-data JSON for the images ``paths`` name, written to the new file ``path`` through
    vit-fast's writer; returns how many images it holds."""
    from vit_fast.serve.encoded import encoded_files, perf_analyzer_data
    from vit_fast.util.files import write_new

    blobs = encoded_files(paths)
    write_new(path, perf_analyzer_data(blobs))
    return len(blobs)


def measure(
    pa: str, ports: list[int], protocol: str, batch: int, concurrency: int, interval_ms: int, tmp: Path, data: list
):
    """One perf_analyzer point: inferences/s, p50 and p99 in ms, and the load average around it. ``data``: what
    perf_analyzer sends (``--shape ...`` for float images, ``--input-data FILE`` for image files)."""
    url = f"127.0.0.1:{ports[1] if protocol == 'grpc' else ports[0]}"
    out = tmp / "pa.csv"
    out.unlink(missing_ok=True)
    cmd = [pa, "-m", MODEL, "-u", url, "-i", protocol, "-b", str(batch), "--concurrency-range", str(concurrency)]
    cmd += ["--measurement-interval", str(interval_ms), "--stability-percentage", "100", "--max-trials", "10"]
    cmd += [*data, "-f", str(out)]
    load = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not out.is_file():
        said = (done.stdout + done.stderr).strip().splitlines()[-1:]
        unstable = any("stable" in line for line in said)  # "Failed to obtain stable measurement ..."
        return {"error": said, "unstable": unstable, "load": load}
    row = next(csv.DictReader(out.open()))
    return {
        "inferences_per_s": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1e3,
        "p99_ms": float(row["p99 latency"]) / 1e3,
        "load": round((load + os.getloadavg()[0]) / 2, 2),
    }


def median_run(runs: list[dict]) -> dict:
    """Of one side's runs of a point, the one with the median inferences/s (the lower middle of an even count),
    with every run's inferences/s under "runs"; a side with no measured run keeps its first error."""
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["inferences_per_s"])
    if not ok:
        return {**runs[0], "runs": [None] * len(runs)}
    return {**ok[(len(ok) - 1) // 2], "runs": [r.get("inferences_per_s") for r in runs]}


def table(points: list[dict]) -> str:
    """Markdown: one row per point; a side perf_analyzer could not measure stably reads "unstable", one it could
    not measure at all "failed" (its message is in the JSON and was printed with the point)."""

    def side(m: dict) -> tuple[str, str]:
        if "error" in m:
            word = "unstable" if m.get("unstable") else "failed"
            return word, word
        return f"{m['inferences_per_s']:.1f}", f"{m['p50_ms']:.1f} / {m['p99_ms']:.1f}"

    lines = [
        "| protocol | batch | concurrency | vit-fast inf/s | plain inf/s | ratio | vit-fast p50 / p99 ms | "
        "plain p50 / p99 ms | p99 ours/plain | load avg | run ratios |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        ours, plain = p["vit-fast"], p.get("plain")  # no plain side with --images (vit-fast serve --encoded alone)
        ours_rate, ours_lat = side(ours)
        plain_rate, plain_lat = side(plain) if plain is not None else ("-", "-")
        both = plain is not None and "error" not in ours and "error" not in plain
        ratio = f"{ours['inferences_per_s'] / plain['inferences_per_s']:.2f}" if both else "-"
        p99 = f"{ours['p99_ms'] / plain['p99_ms']:.2f}" if both else "-"
        runs = (plain or {}).get("runs", [])
        pairs = [a / b for a, b in zip(ours.get("runs", []), runs, strict=False) if a and b]
        spread = f"{min(pairs):.2f}-{max(pairs):.2f}" if len(pairs) > 1 else "-"
        load = f"{ours['load']:.1f}" + (f" / {plain['load']:.1f}" if plain is not None else "")
        lines.append(
            f"| {p['protocol']} | {p['batch']} | {p['concurrency']} | {ours_rate} | {plain_rate} | {ratio} | "
            f"{ours_lat} | {plain_lat} | {p99} | {load} | {spread} |"
        )
    return "\n".join(lines)


def ints(high: int):
    """A comma-separated list of ints from 1 to ``high``."""
    from script_args import bounded

    one = bounded(int, 1, high)

    def parse(text: str) -> list[int]:
        return [one(t.strip()) for t in text.split(",")]

    return parse


def protocols(text: str) -> str:
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    if not chosen or any(t not in ("grpc", "http") for t in chosen):
        raise argparse.ArgumentTypeError(f"{text!r}: grpc, http or grpc,http")
    return ",".join(chosen)


def main(argv: list[str] | None = None) -> None:
    from script_args import ScriptParser, bounded

    p = ScriptParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--perf-analyzer", default=".tools/perf_analyzer/perf_analyzer", metavar="PATH")
    p.add_argument("--concurrency", type=ints(1024), default=[1, 2, 4, 8, 16])
    p.add_argument("--batch", type=ints(4096), default=[1, 8])
    p.add_argument("--protocols", type=protocols, default="grpc,http")
    p.add_argument("--interval-ms", type=bounded(int, 100, 600000), default=3000)
    p.add_argument(
        "--repeats",
        type=bounded(int, 1, 100),
        default=1,
        metavar="N",
        help="measure each point N times on each side, alternating, and report the median run (default 1)",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write every figure here")
    p.add_argument(
        "--plain-threads",
        type=bounded(int, 1, 4096),
        default=None,
        metavar="T",
        help="OMP_NUM_THREADS for the plain script (default: unset, torch's own count, as a user would run it)",
    )
    p.add_argument(
        "--serve-flags",
        default="",
        metavar="FLAGS",
        help="more flags for vit-fast serve, e.g. '--queue-delay-us 100' (default: none, serve's own defaults)",
    )
    p.add_argument(
        "--images",
        nargs="+",
        default=None,
        metavar="PATH",
        help="image files or folders (the first 64 images): measure vit-fast serve --encoded alone, sending these",
    )
    p.add_argument(
        "--write-input-data",
        default=None,
        metavar="FILE",
        help="with --images: write perf_analyzer's --input-data JSON for them to FILE (a new .json) and stop",
    )
    args = p.parse_args(argv)
    from vit_fast.util.files import check_output_file, check_report_file, write_json_atomic

    if args.write_input_data is not None:
        if args.images is None:
            p.error("--write-input-data goes with --images: name the image files or folders to write")
        try:
            target = check_output_file(args.write_input_data, (".json",), "--write-input-data", ours=lambda _: False)
            count = write_input_data(args.images, target)
        except (ValueError, OSError) as err:
            p.error(str(err))
        print(f"wrote {target}: {count} images for perf_analyzer --input-data {target}")
        return
    if not Path(args.perf_analyzer).is_file():
        sys.exit(f"no perf_analyzer at {args.perf_analyzer}: run benchmarks/get_perf_analyzer.sh (make perf-analyzer)")
    probe = subprocess.run([args.perf_analyzer, "--version"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:  # e.g. a launcher whose libraries were moved: say so before the servers start
        said = (probe.stdout + probe.stderr).strip().splitlines()[-1:] or [f"exit status {probe.returncode}"]
        sys.exit(f"{args.perf_analyzer} does not run: {said[0]}\nget it again with benchmarks/get_perf_analyzer.sh")
    try:  # before the servers start
        json_path = None if args.json is None else check_report_file(args.json, "--json")
        if args.images is not None:
            from vit_fast.serve.encoded import encoded_files

            encoded_files(args.images)  # every file readable and within the bound, before the server starts
    except (ValueError, OSError) as err:
        p.error(str(err))
    sides = ("vit-fast",) if args.images is not None else ("vit-fast", "plain")
    with tempfile.TemporaryDirectory(prefix="vit-fast-serve-perf-") as folder:
        tmp = Path(folder)
        weights, config = write_weights(tmp)
        data = ["--shape", "images:1,32,32"]
        if args.images is not None:
            write_input_data(args.images, tmp / "images.json")
            data = ["--input-data", str(tmp / "images.json")]
        servers, procs = {}, []
        try:
            for name in sides:
                ports = free_ports(3)
                flags = ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
                if name == "vit-fast":
                    # --encoded serves the embedded model itself: a plain state dict carries no preprocessing record
                    model = (
                        ["default", "--encoded"] if args.images is not None else [str(weights), "--config", str(config)]
                    )
                    cmd = [sys.executable, "-m", "vit_fast.cli", "serve", *model]
                    cmd += ["--name", MODEL, *flags, *shlex.split(args.serve_flags)]
                else:
                    cmd = [sys.executable, str(HERE / "plain_pytriton.py"), str(weights), str(config), *flags]
                threads = args.plain_threads if name == "plain" else None
                procs.append(start(name, cmd, ports, tmp / f"{name}.log", threads))
                servers[name] = ports
            print("servers ready:", {n: (tmp / f"{n}.log").read_text().splitlines()[:2] for n in servers}, flush=True)
            points, flip = [], False
            for protocol in args.protocols.split(","):
                for batch in args.batch:
                    for conc in args.concurrency:
                        order = list(reversed(sides)) if flip else list(sides)
                        flip = not flip
                        point = {"protocol": protocol, "batch": batch, "concurrency": conc, "order": order}
                        runs: dict[str, list[dict]] = {name: [] for name in order}
                        for _ in range(args.repeats):
                            for name in order:
                                runs[name].append(
                                    measure(
                                        args.perf_analyzer,
                                        servers[name],
                                        protocol,
                                        batch,
                                        conc,
                                        args.interval_ms,
                                        tmp,
                                        data,
                                    )
                                )
                        for name in order:
                            point[name] = median_run(runs[name])
                        points.append(point)
                        print(json.dumps(point), flush=True)
        finally:
            for proc in procs:  # Ctrl-C to each server's process group: PyTriton's serve() stops cleanly on SIGINT
                os.killpg(proc.pid, signal.SIGINT)
            for proc in procs:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print(table(points))
    if json_path is not None:
        write_json_atomic({"points": points, "cores": os.cpu_count()}, json_path)


if __name__ == "__main__":
    main()
