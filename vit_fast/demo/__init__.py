"""``vit-fast demo``: the main job end to end on the embedded default model, composed from the library.

Each name below loads its submodule on first use, so ``vit_fast.demo.settings`` (what the command line builds
its parser from) imports no torch. The steps, the pictures and which module holds each: docs/cli.md.
"""

from __future__ import annotations

from vit_fast.util.lazy import lazy_names

#: submodule -> the public names it defines
__all__, __getattr__, __dir__ = lazy_names(
    __name__,
    {
        "settings": ("DEFAULT_OUT", "DemoSettings", "ONNX_NAME", "ONNX_REPORT"),
        "steps": ("ACCURACY_TOLERANCE_PP",),
        "interpreter": ("INTERPRETER_BATCHES",),
        "report": ("OUTPUT_FILES", "STEPS", "check_demo_outputs", "format_table", "run_demo"),
    },
)
