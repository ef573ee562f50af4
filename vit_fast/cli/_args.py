"""The one grammar of the command line: argument types and output paths shared by every subcommand.

Types that refuse a bad value while parsing (``batch_list``, ``dtype_name(s)``, :class:`Number` for every numeric
flag, ``device``), :class:`Parser` (a rejected command line is one line and exit 2), output paths checked before any
work, and ``--json PATH|-``. Each rule: docs/development.md, "The argument grammar"."""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from vit_fast.util.batches import parse_batch_list
from vit_fast.util.files import (
    check_report_file,
    check_suffix,
    existing_folder,
    json_text,
    nulled_streams,
    special_kind,
    stdout_to_stderr,
    write_atomic,
    write_json_atomic,
)

# nothing here imports torch at module level: the parser is built, and a bad argument refused, before torch loads

JSON_HELP = "also write the report as JSON to this file"
#: ``--json -``: the report goes to standard output, and everything else the command prints goes to stderr
STDOUT = "-"
MODEL_HELP = (
    '"default", a preset name (random weights), a checkpoint file, a Hugging Face folder, timm:NAME or hf:ORG/NAME'
)


class Parser(argparse.ArgumentParser):
    """argparse's parser with vit-fast's one-line errors: a rejected command line prints
    ``vit-fast <command>: error: argument --x: <why>; see vit-fast <command> --help`` and exits 2, without the
    usage block (a subcommand's usage runs to a dozen lines and hides the line that matters). Subcommand parsers
    are of the same class (argparse makes them with its parent's type)."""

    def error(self, message: str):  # argparse's hook: must not return
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text}; see {self.prog} --help\n")


class CommandError(Exception):
    """A failure the user can fix; ``vit-fast`` prints its message on one line and exits 1."""


#: errno -> (what went wrong, how to fix it): OSErrors whose own text names neither the path nor a fix
_OS_ERRORS = {
    errno.ENOSPC: ("no space left on its device", "free space there, or choose a path on another disk"),
    errno.EDQUOT: ("the disk quota is used up", "free space there, or choose a path on another disk"),
    errno.ENAMETOOLONG: (
        "the path is too long (a name over 255 bytes, or a path over 4096)",
        "choose a shorter file or folder name",
    ),
    errno.EROFS: ("it is on a read-only file system", "choose a writable path"),
}


def os_error_text(err: OSError) -> str | None:
    """A full disk, a too-long path or a read-only file system as the path and the fix, for the CLI's one-line
    error (None for other OSErrors, whose own text is kept)."""
    known = _OS_ERRORS.get(err.errno)
    if known is None:
        return None
    problem, fix = known
    paths = [str(p) for p in (err.filename, err.filename2) if p is not None]
    if not paths:
        return f"cannot write: {problem}; {fix}"
    return f"cannot write {' -> '.join(repr(p) for p in paths)}: {problem}; {fix}"


class Number:
    """The ``type=`` of every numeric flag: ``kind`` (int or float) from ``low`` (exclusive with ``above``) up to
    ``high``. A count, size, port or time goes through one of these, never a bare ``int`` / ``float``, so 0, a
    negative or a word is a usage error (exit 2) naming the flag, the value and what is allowed."""

    def __init__(self, kind: type, low: int | float, high: int | float | None = None, *, above: bool = False):
        self.kind, self.low, self.high, self.above = kind, low, high, above
        noun = "an int" if kind is int else "a number"
        if high is not None:  # an exclusive low end said as such: 0 is refused by "above 0"
            self.bound = f"above {low}, up to {high}" if above else f"from {low} to {high}"
        else:
            self.bound = f"{'>' if above else '>='} {low}"
        self.allowed = f"{noun} {self.bound}"
        self.__name__ = self.allowed  # argparse names a type by this in its own messages

    def __repr__(self) -> str:
        return f"Number({self.allowed})"

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.allowed}, got {text!r}") from None
        if self.kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number {self.bound}, got {text!r}")
        too_low = value <= self.low if self.above else value < self.low
        if too_low or (self.high is not None and value > self.high):
            # a range names its kind ("must be an int from 0 to ..."); a lower bound alone reads "must be >= 1"
            wanted = self.allowed if self.high is not None else self.bound
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value}")
        return value


positive_int = Number(int, 1)
nonnegative_int = Number(int, 0)
positive_float = Number(float, 0, above=True)
#: TCP ports to listen on
port = Number(int, 1, 65535)
#: an ONNX opset: LayerNormalization needs 17 (vit_fast.export.onnx_checks.MIN_OPSET, which imports torch; a test
#: pins the two equal); the exporter's own check names the newest opset it can write
opset = Number(int, 17)


def batch_list(*names: str) -> Callable[[str], list[int]]:
    """The ``--batch`` type: ``"1,8,64"`` -> ``[1, 8, 64]``, naming the bad item on error.

    With ``names`` (e.g. ``"MIN", "MAX"``) exactly that many items (a range); without, any number
    of distinct sizes (``vit_fast.util.batches.parse_batch_list``).
    """

    def parse(text: str) -> list[int]:
        try:
            sizes = parse_batch_list(text, names)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        if names and sizes != sorted(sizes):  # a range (MIN,MAX or MIN,OPT,MAX) in order, refused while parsing
            order, example = " <= ".join(names), ",".join(map(str, sorted(sizes)))
            raise argparse.ArgumentTypeError(
                f"{text!r} is out of order: give {','.join(names)} with {order}, e.g. {example}"
            )
        return sizes

    parse.__name__ = "batch list"  # argparse names the type in its generic messages
    parse.items = names  # what a valid value holds (tests/cli/test_cli_flags.py walks every flag's type)
    return parse


def dtype_name(text: str) -> str:
    """The ``--dtype`` type for one precision: any vit_fast.util.dtypes spelling -> ``fp32`` / ``fp16`` / ``bf16``."""
    from vit_fast.util.dtypes import DTYPES, canonical_name

    name = canonical_name(text)
    if name is None:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: choose from {', '.join(DTYPES)}")
    return name


def dtype_names(text: str) -> list[str]:
    """The ``--dtype`` type for a comma-separated list of precisions."""
    from vit_fast.util.dtypes import parse_dtype_list

    try:
        return parse_dtype_list(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def device(text: str) -> str:
    """The ``--device`` type: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; a CUDA device must be visible."""
    spec = text.strip()
    if spec in ("auto", "cpu"):
        return spec
    kind, _, index = spec.partition(":")
    if kind != "cuda" or not (index == "" or index.isdigit()):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}: use auto, cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"{spec!r} asked for, but no CUDA GPU is visible to torch {torch.__version__}: use cpu or auto"
        )
    if index and int(index) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{spec!r} does not exist: {torch.cuda.device_count()} GPU(s) visible")
    return spec


def output_folder(folder: str | os.PathLike, flag: str = "--out", given: str | os.PathLike | None = None) -> Path:
    """Check, before any work, that ``folder`` can be written: it exists as a writable folder, or its nearest existing
    parent is one (missing folders are made when the first file is written, so a run that fails early leaves the file
    system as it was). A path under a regular file is refused, and so is a link on the way that dangles (an unmounted
    drive behind it) or loops (:func:`vit_fast.util.files.existing_folder`). ``given``: the path the user typed, when
    ``folder`` is the folder of a file to write (named in errors)."""
    folder = Path(folder)
    named = f"{flag} {str(given if given is not None else folder)!r}"
    try:
        existing = existing_folder(folder, flag, named=given if given is not None else folder)
    except ValueError as err:
        raise CommandError(str(err)) from None
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CommandError(f"{named}: the folder {str(existing)!r} cannot be written; choose another path")
    # every command makes missing folders, and says so before the work; a folder output (bench --out DIR, a model
    # repository) is made anyway: only the folders above it are news
    above = folder if given is not None else folder.parent
    if os.path.abspath(existing) != os.path.abspath(above) and os.path.abspath(existing) != os.path.abspath(folder):
        print(
            f"vit-fast: note: {flag}: folder {str(above)!r} does not exist; it is made when the first file is written",
            file=sys.stderr,
        )
    return folder


def output_file(path: str | os.PathLike | None, flag: str, suffixes: tuple[str, ...] = ()) -> Path | None:
    """Check a file to write (``--json``, ``export --out``): refuse a folder, a file's child, a link on the way that
    dangles or loops, and, given ``suffixes``, a final name without one of them
    (:func:`vit_fast.util.files.check_suffix`). Its folder is made when the file is written."""
    if path is None:
        return None
    example = "model" + suffixes[0] if suffixes else "report.json"
    if os.fspath(path).endswith(("/", os.sep)) or Path(path).is_dir():  # "trail/" names a folder, made or not
        folder = Path(path)
        raise CommandError(
            f"{flag} {os.fspath(path)!r} is a folder; give a file path such as {str(folder / example)!r}"
        )
    path = Path(path)
    if suffixes:
        try:
            check_suffix(path, suffixes, flag)
        except ValueError as err:
            raise CommandError(str(err)) from None
    output_folder(path.parent, flag, given=path)
    return path


def copy_file(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Write a copy of the report ``src`` to ``dst`` (``--json`` beside a folder of reports), atomically."""
    return write_atomic(dst, Path(src).read_bytes())


def json_target(text: str) -> str:
    """The ``--json`` type: ``-`` (standard output) or a path ending in ``.json`` (any case). Whether the file can
    be written is checked when the command starts (:func:`json_file`), which also names what an existing folder,
    FIFO or device (``/dev/null``) given here is."""
    if text == STDOUT or special_kind(text) is not None:  # a folder, FIFO or device: named when the command starts
        return text
    if not text.strip():
        raise argparse.ArgumentTypeError("got an empty path: give a file such as report.json, or - for standard output")
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a folder (it ends in '/'): give a file path such as {str(Path(text) / 'report.json')!r}, or "
            "- for standard output"
        )
    if not text.lower().endswith(".json"):
        stem = Path(text).stem or "report"
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a .json file: give a path such as {stem}.json, or - for standard output"
        )
    return text


json_target.__name__ = "JSON path"  # argparse names the type in its generic messages


def add_json(parser: argparse.ArgumentParser, help: str = JSON_HELP, *, bare: bool = False) -> None:
    """``--json PATH|-``; with ``bare``, ``--json`` alone means standard output (``vit-fast info --json``: only
    for a command without positional arguments, which a bare ``--json`` would otherwise swallow)."""
    help = f"{help} (- for standard output{', as is --json alone' if bare else ''}: then the command's other "
    help += "output goes to stderr)"
    more: dict[str, Any] = {"nargs": "?", "const": STDOUT} if bare else {}
    parser.add_argument("--json", metavar="PATH", type=json_target, default=None, help=help, **more)


def json_file(
    value: str | None, *, overwrite: bool = False, artifacts: Sequence[str | os.PathLike] = ()
) -> Path | str | None:
    """What ``--json`` names, checked before any work: the file, by the one output policy
    (:func:`vit_fast.util.files.check_report_file`: never an artifact's metadata, a FIFO or a file vit-fast did not
    write unless ``overwrite``); :data:`STDOUT` for ``-``; None without ``--json``."""
    if value is None or value == STDOUT:
        return value
    path = output_file(value, "--json")
    import vit_fast.export.formats  # noqa: F401  (registers the artifact suffixes the policy refuses reports beside)

    return check_report_file(path, "--json", overwrite=overwrite, artifacts=artifacts)


def file_only(target: Path | str | None) -> Path | None:
    """The ``--json`` file to hand to a library call that writes it; None for standard output or no ``--json``."""
    return None if target is None or target == STDOUT else Path(target)


#: the command's real standard output while :func:`json_only_on_stdout` sends everything else to stderr
_json_stream: IO[str] | None = None


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # replaced (a test's capture), closed or detached
        return None


@contextlib.contextmanager
def json_only_on_stdout() -> Iterator[None]:
    """While a command runs with ``--json -``: what it prints to ``sys.stdout``, and what a child process or a
    native library writes to file descriptor 1, goes to stderr (:func:`vit_fast.util.files.stdout_to_stderr`), so that
    standard output carries the JSON report (written by :func:`write_json` / :func:`copy_json`) alone. Both are put
    back on exit, so a reader that went away is still told apart by the CLI (``stdout_reader_gone``)."""
    global _json_stream
    real = sys.stdout
    if real is None or "stdout" in nulled_streams():  # fd 1 was closed (``>&-``): nowhere to put the report
        raise CommandError("--json -: standard output is closed; give a file path such as report.json")
    real.flush()
    if sys.stderr is not None:
        sys.stderr.flush()
    with stdout_to_stderr() as kept:
        # sys.stdout writes to fd 1, now stderr: the report goes to the kept copy (a test's capture keeps its own)
        _json_stream = kept if kept is not None and _fileno(real) == 1 else real
        try:
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            _json_stream = None
            with contextlib.suppress(AttributeError, OSError, ValueError):
                real.flush()  # what went through an older reference to sys.stdout: to stderr, with the rest
            with contextlib.suppress(AttributeError, OSError, ValueError):
                sys.stderr.flush()


def _print_json(text: str) -> None:
    stream = _json_stream or sys.stdout
    stream.write(text)
    stream.flush()  # a reader (``| jq``, a script waiting on serve's endpoints) gets it now


def json_stream() -> IO[str]:
    """Where ``--json -`` output goes: the real standard output, also while :func:`json_only_on_stdout` holds (for a
    command that writes JSON lines as it goes)."""
    return _json_stream or sys.stdout


def write_json(data: Any, target: Path | str | None, mode: int | None = None) -> Path | None:
    """Write the report ``data`` where ``--json`` said (:func:`json_file`): standard output for ``-``, else the
    file (atomically, through :mod:`vit_fast.util.files`, with ``mode`` where given: 0o600 for a secret); returns the
    file written, if any."""
    if target is None:
        return None
    if target == STDOUT:
        _print_json(json_text(data))
        return None
    return write_json_atomic(data, target, mode=mode)


def copy_json(src: str | os.PathLike, target: Path | str | None) -> Path | None:
    """Put the JSON report ``src`` where ``--json`` said: its text on standard output for ``-``, else a copy."""
    if target is None:
        return None
    if target == STDOUT:
        _print_json(Path(src).read_text())
        return None
    return copy_file(src, target)


def add_threads(parser: argparse.ArgumentParser, note: str) -> None:
    parser.add_argument(
        "--threads", type=positive_int, default=None, metavar="T", help=f"torch CPU threads (default: torch's; {note})"
    )


#: seeds are 32-bit: the bench derives per-batch seeds from them (``seed * 100003 + batch``), which must stay
#: inside torch's 64-bit ``manual_seed``
MAX_SEED = 2**32 - 1


#: the ``--seed`` type (torch refuses larger seeds only deep inside)
seed = Number(int, 0, MAX_SEED)


def add_seed(parser: argparse.ArgumentParser, default: int | None, what: str) -> None:
    fresh = "fresh each run" if default is None else str(default)
    parser.add_argument("--seed", type=seed, default=default, help=f"seed of {what} (default: {fresh})")


def size_mix(text: str) -> list[tuple[int, int]]:
    """``32x48,48x32``: one batch of images of those sizes (h x w pixels)."""
    sizes = []
    for item in text.split(","):
        h, sep, w = item.strip().lower().partition("x")
        if not sep or not h.isdigit() or not w.isdigit() or int(h) < 1 or int(w) < 1:
            raise argparse.ArgumentTypeError(f"expected sizes HxW[,HxW...] in pixels, e.g. 32x48,48x32; got {text!r}")
        sizes.append((int(h), int(w)))
    return sizes


def add_verify_batch(parser: argparse.ArgumentParser, range_flag: str = "--batch") -> None:
    """``--verify-batch``: the batch sizes an exporter verifies, inside the range its ``range_flag`` sets for the
    artifact (the quicker check on a slow machine: fewer batches, the same artifact)."""
    parser.add_argument(
        "--verify-batch",
        type=batch_list(),
        default=None,
        metavar="B[,B...]",
        help=f"batch sizes to verify, within {range_flag}'s range (default: its minimum, an odd batch and its "
        f"maximum); fewer make a quicker check, the artifact keeps {range_flag}'s range",
    )


def name_list(text: str) -> list[str]:
    """A comma-separated list of names (``logits,pooled``): no empty item, no repeat."""
    items = [t.strip() for t in str(text).split(",")]
    if any(not t for t in items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item: give comma-separated names, e.g. a,b")
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{text!r} names something twice")
    return items


def float_list(text: str) -> list[float]:
    """A comma-separated list of finite numbers (``0.485,0.456,0.406``)."""
    out = []
    for item in str(text).split(","):
        try:
            value = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} in {text!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{item.strip()!r} in {text!r} is not a finite number")
        out.append(value)
    return out


def add_batches(parser: argparse.ArgumentParser, default_help: str) -> None:
    parser.add_argument(
        "--batch",
        type=batch_list(),
        default=None,
        metavar="B[,B...]",
        help=f"batch sizes, comma-separated ({default_help})",
    )


def add_dtypes(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--dtype", type=dtype_names, default=None, metavar="D[,D...]", help=help)


def add_device(
    parser: argparse.ArgumentParser, default: str, help: str, choices: tuple[str, ...] | None = None
) -> None:
    parser.add_argument("--device", type=device, choices=choices, default=default, help=help)


def add_child_timeout(parser: argparse.ArgumentParser, flag: str, default: float, when: str) -> None:
    text = f"seconds the interpreter child process may take {when} (default {default:g})"
    parser.add_argument(flag, type=positive_float, default=default, metavar="S", help=text)


def add_optional(parser: argparse.ArgumentParser, flags: tuple[tuple[str, Callable, str | None, str], ...]) -> None:
    """Flags with no default of their own (the settings pick it): each row ``(flag, type, metavar, help)``."""
    for flag, kind, metavar, text in flags:
        parser.add_argument(flag, type=kind, default=None, metavar=metavar, help=text)


def add_model_source(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--weights``: where a plain state dict's architecture, or a timm model's weights, come from."""
    parser.add_argument(
        "--config",
        default=None,
        metavar="PRESET|config.json",
        help="the architecture of a plain timm / Hugging Face state-dict MODEL file: a preset or a config.json",
    )
    parser.add_argument(
        "--weights", default=None, metavar="FILE", help="pretrained weights for a timm:NAME MODEL (nothing downloaded)"
    )


def add_overwrite(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--overwrite", action="store_true", help="replace existing files that vit-fast did not write (never by default)"
    )
