"""The ``vit-fast`` command line: the parser (:func:`build_parser`, one module per subcommand in this folder) and
:func:`main`, the one place that turns a failure into an exit status and a one-line message.

Exit statuses, ``--json -``, closed standard streams and how a subcommand module is laid out: docs/development.md,
section "Inside vit_fast/cli/"; as a user meets them: docs/cli.md, "What every command shares"."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator

# subcommand -> (module defining EXAMPLE, add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "info": ("vit_fast.cli.info", "versions, GPU, and which backends can run here"),
    "demo": ("vit_fast.cli.demo", "the main job on the embedded default model: accuracy, backends, export, timing"),
    "export": ("vit_fast.cli.export", "build an ONNX or TensorRT artifact, verify it, write a report"),
    "verify": ("vit_fast.cli.verify", "compare an ONNX file, TensorRT engine or the triton backend with eager"),
    "bench": ("vit_fast.cli.bench", "time backends side by side; write JSON, Markdown and a PNG plot"),
    "predict": ("vit_fast.cli.predict", "run a model on image files: top-k labels, or pooled features"),
    "serve": ("vit_fast.cli.serve", "serve a model through Triton Inference Server (PyTriton), or load-test it"),
    "doctor": ("vit_fast.cli.doctor", "prove the stack here: environment, every kernel and the model vs float64"),
}


def add_subcommand(sub: argparse._SubParsersAction, name: str, doc: str | None, help: str, example: str):
    """A subcommand parser whose ``--help`` shows the module docstring and one example."""
    return sub.add_parser(
        name,
        help=help,
        description=(doc or help).strip(),
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def command_in(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top level's options,
    --help and --version, take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given ``argv``, only the subcommand it names gets its arguments (the others are
    listed by name and help), so ``--help``, ``--version`` and a parse error import no subcommand module and
    no torch."""
    from vit_fast.cli._args import Parser  # one-line usage errors, for every subcommand's parser too
    from vit_fast.util.version import __version__

    parser = Parser(
        prog="vit-fast",
        description="Fast Vision Transformers on NVIDIA GPUs: Triton kernels, verified ONNX/TensorRT export, "
        "honest benchmarks.",
        epilog="example:\n  vit-fast demo --out vit-fast-out/demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vit-fast {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = None if argv is None else command_in(argv)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if argv is not None and name != chosen:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_name)
        p = add_subcommand(sub, name, module.__doc__, help_text, module.EXAMPLE)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def is_user_error(err: BaseException) -> bool:
    """A failure the user can cause and fix (one line, exit 1) rather than a bug (traceback)."""
    if isinstance(err, (NotImplementedError, RecursionError)):
        return False
    # vit-fast's own exception classes (ArtifactError, ExportError, VerificationError, BenchError, CommandError)
    # are raised on purpose with a message; the builtin kinds below are what bad input, missing files or extras
    # and unusable hardware raise (TypeError, AttributeError, ... stay bugs)
    return type(err).__module__.startswith("vit_fast.") or isinstance(
        err, (ValueError, LookupError, OSError, ImportError, RuntimeError)
    )


def error_message(err: BaseException) -> str:
    """The text of ``err`` on one line: KeyError's message without its quotes, a hint for a missing extra."""
    from vit_fast.cli._args import os_error_text  # full disk, too-long path: the path and the fix, not errno text
    from vit_fast.util.text import plain_text

    text = os_error_text(err) if isinstance(err, OSError) else None
    text = text or (str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err))
    text = " ".join(plain_text(text).split()) or type(err).__name__  # no colour codes of a library's
    missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    if missing and (extra := module_extra(missing.split(".")[0])) is not None:
        from vit_fast.backend.env import install_hint

        text += f" (the {extra} extra: {install_hint(extra)})"
    return text


def module_extra(module: str) -> str | None:
    """The extra that installs ``module``: an export format's (its entry's ``modules`` in the formats' table), else
    ``vit_fast.backend.env.MODULE_EXTRAS``'s; None for a module no extra installs."""
    from vit_fast.backend.env import MODULE_EXTRAS, extras  # only here: vit_fast.backend.env imports torch
    from vit_fast.export.formats import FORMATS

    formats = {m: f.extra for f in FORMATS.values() for m in f.modules}
    extra = formats.get(module, MODULE_EXTRAS.get(module))
    return extra if extra in extras() else None  # a hint that names a missing extra would fail on the error path


#: the exit status when the reader of stdout went away (``vit-fast info | head -1``): 128 + SIGPIPE, what the shell
#: reports for any Unix tool that SIGPIPE stops there, so ``set -o pipefail`` scripts see vit-fast as they see ``cat``
READER_GONE = 141


def stdout_reader_gone() -> bool:
    """True when stdout is a pipe or socket whose reading end is closed: a BrokenPipeError is then the reader
    stopping early, not a failure of the command (a broken pipe to a child process or server is one)."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, 0)  # POLLERR / POLLHUP are always reported
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real stdout (replaced, closed): nothing to tell
        return False


@contextlib.contextmanager
def _any_file_name_prints() -> Iterator[None]:
    """Within the block, the process's own stdout and stderr write a file name that is not UTF-8 (Python holds it
    with lone surrogates) as its own bytes, as ``ls`` does, instead of failing with UnicodeEncodeError after the
    work is done; their previous error handling comes back after (streams a caller put in their place, such as a
    test's capture, are left alone)."""
    previous = []
    for stream in (sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            previous.append((stream, stream.errors))
            stream.reconfigure(errors="surrogateescape")
    try:
        yield
    finally:
        for stream, errors in previous:
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.reconfigure(errors=errors)


def _flush_stdout() -> None:
    if sys.stdout is not None:  # None: a caller embedding vit-fast without one
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Run ``vit-fast`` with ``argv`` (default: sys.argv[1:]); returns the exit status.

    Output piped into something that closes early (``vit-fast info | head -1``) ends the command quietly with
    :data:`READER_GONE`: no "Broken pipe" error and no BrokenPipeError when Python flushes stdout at exit.
    Closed standard streams and SIGTERM are handled as docs/development.md, "Inside vit_fast/cli/" says."""
    from vit_fast.util.files import usable_standard_streams

    for what in usable_standard_streams():
        if not what.startswith("stdin"):
            print(f"vit-fast: note: {what}; it now points at {os.devnull}: what goes there is lost", file=sys.stderr)
    try:
        try:
            with _any_file_name_prints():
                status = _main(argv)
                _flush_stdout()  # what is still buffered fails here, not in the interpreter's flush at exit
        except SystemExit:  # --help, --version and usage errors print, then exit
            _flush_stdout()
            raise
        return status
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        # nothing more can reach the reader; point stdout at devnull so the flush at exit has nowhere to fail
        from vit_fast.util.files import stdout_to_null

        stdout_to_null(sys.stdout.fileno())
        return READER_GONE


def _main(argv: list[str] | None) -> int:
    from vit_fast.base.switches import SwitchError, check_switches

    try:  # every VIT_FAST_* switch and TRITON_INTERPRET, before anything reads one or any work starts
        check_switches()
    except SwitchError as err:
        print(f"vit-fast: error: {err}", file=sys.stderr)
        return 2
    from vit_fast.util import interrupts

    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_in(argv) or ""
    # Ctrl-C anywhere, torch's import included, is one line and 130; SIGTERM raises too (143), so a long command
    # keeps what it finished (vit_fast.util.interrupts)
    with interrupts.handled():
        try:
            parser = build_parser(argv)
            args = parser.parse_args(argv)
            if not getattr(args, "run", None):
                parser.print_help()
                return 2
            command = " ".join(filter(None, (args.command, getattr(args, "target", None))))
            return _run(args, command)
        except interrupts.INTERRUPTS as err:
            what = "terminated (SIGTERM)" if isinstance(err, interrupts.Terminated) else "interrupted"
            print(f"vit-fast{' ' + command if command else ''}: {what}", file=sys.stderr)
            return interrupts.exit_status(err)


def _run(args: argparse.Namespace, command: str) -> int:
    """The command's body, its failures mapped to exit statuses (docs/development.md); with ``--json -`` its
    other output goes to stderr while it runs, so that stdout holds the JSON report alone."""
    import contextlib

    from vit_fast.base.switches import switch
    from vit_fast.cli._args import STDOUT, json_only_on_stdout

    try:
        with json_only_on_stdout() if getattr(args, "json", None) == STDOUT else contextlib.nullcontext():
            return int(args.run(args) or 0)
    except Exception as err:
        from vit_fast.util.interrupts import interrupt_behind

        if (interrupt := interrupt_behind(err)) is not None:  # Ctrl-C a library wrapped: still "interrupted", 130
            raise interrupt from err
        if isinstance(err, BrokenPipeError) and stdout_reader_gone():
            raise  # the reader of stdout stopped early: main() exits quietly
        if not is_user_error(err) or switch("VIT_FAST_TRACEBACK", False):
            raise
        print(f"vit-fast {command}: error: {error_message(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
