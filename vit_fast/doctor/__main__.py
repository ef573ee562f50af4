"""The interpreter child: ``python -m vit_fast.doctor SETTINGS.json RESULT.json [PROGRESS.json]`` runs the
CPU checks in Triton's interpreter and writes them (:func:`vit_fast.doctor.interpreter.child_main`)."""

import contextlib
import sys

from .interpreter import child_main

try:
    with contextlib.suppress(BrokenPipeError):
        sys.exit(child_main(*sys.argv[1:4]))
except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent reports it, quietly here
    sys.exit(130)
