"""A pytest plugin that runs timm's own test files against vit-fast's drop-in: every model timm's
``create_model`` builds is handed to ``vit_fast.apply_vit_fast`` before the test sees it.

    python -m pytest -p tests.peers.timm_plugin --vit-fast=triton .peers/timm/tests/test_models.py -k test_vit

``--vit-fast``: ``off`` (timm as released, the baseline), ``auto`` (patched; on a CPU the blocks keep timm's
forwards, on a CUDA card with tensor cores they run our kernels) or ``triton`` (patched, the kernels run, in Triton's
interpreter on a CPU: keep to timm's tiny models there, ``test_vit*`` and the models timm's tests build small). The
models handed to apply_vit_fast are those of the timm classes it reads (``vit_fast.interop.timm_reading.MODEL_CLASSES``:
VisionTransformer, VisionTransformerDistilled, Eva, NaFlexVit) or refuses by name (RelPos, SAM, ...); one it refuses
(by name, or for a feature such as RoPE in a NaFlexVit) or that is none of those is left as timm built it, and
counted in the summary line.
The torchvision stand-in (tests/torchvision_standin.py) is installed where the real torchvision is missing.

The launch counter (tools/peers/launches.py) is registered too, in every mode: with ``VIT_FAST_PEERS_LAUNCHES`` set
(tools/peer_timm.py sets it) our kernels' launches are counted per model (the tests' ``model_name`` parameter, else
the name of the model patched here), and each model patched here is noted for its suite.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.torchvision_standin import install as _install_torchvision_standin  # noqa: E402

_install_torchvision_standin()

_COUNTS = {"patched": 0, "refused": 0, "other": 0}


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--vit-fast",
        default="off",
        choices=("off", "auto", "triton"),
        help="patch every model timm.create_model builds with vit_fast.apply_vit_fast(backend=...); off: timm alone",
    )


def _wrap(create_model, backend: str):
    import vit_fast
    from vit_fast.interop.timm_reading import _REFUSED_MODELS, MODEL_CLASSES

    vits = (*MODEL_CLASSES, *_REFUSED_MODELS)  # the classes apply_vit_fast reads, and those it refuses by name

    @functools.wraps(create_model)
    def create_and_patch(*args, **kwargs):
        model = create_model(*args, **kwargs)
        if type(model).__name__ not in vits:
            _COUNTS["other"] += 1
            return model
        if kwargs.get("features_only"):
            _COUNTS["other"] += 1  # a FeatureGetterNet wrapper: its inner model is not the one returned
            return model
        try:
            vit_fast.apply_vit_fast(model, backend=backend)
            _COUNTS["patched"] += 1
            name = args[0] if args else kwargs.get("model_name")
            _launches().note_patched(meta=any(p.is_meta for p in model.parameters()), model=name)
        except ValueError:  # refused by name (rotary attention, relative position bias, head dim ...)
            _COUNTS["refused"] += 1
        return model

    return create_and_patch


def _launches():
    """tools/peers/launches.py (tools/ is no package), loaded once under the name the transformers harness gives it."""
    name = "vit_fast_peer_launches"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "tools" / "peers" / "launches.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def pytest_configure(config) -> None:
    config.pluginmanager.register(_launches(), "vit_fast_peer_launches")
    backend = config.getoption("--vit-fast")
    if backend == "off":
        return
    import timm
    import timm.models
    import timm.models._factory

    patched = _wrap(timm.models._factory.create_model, backend)
    # test files import the name from any of these before the tests run: replace it everywhere it is bound
    timm.create_model = timm.models.create_model = timm.models._factory.create_model = patched


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    backend = config.getoption("--vit-fast")
    terminalreporter.write_line(
        f"vit-fast peer run: --vit-fast={backend}; models patched {_COUNTS['patched']}, refused by name "
        f"{_COUNTS['refused']}, not ViTs {_COUNTS['other']}"
    )
