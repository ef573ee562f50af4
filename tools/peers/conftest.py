"""pytest plugin for make peers-hf: VIT_FAST_PEERS=none|apply|optimize (VIT_FAST_PEERS_BACKEND=auto|triton).

``apply``: every supported transformers vision model class is patched in place (``vit_fast.apply_vit_fast``) as
it is constructed; ``optimize``: the constructed instance takes over the state of ``vit_fast.optimize(model)``
(a patched deep copy), so every test that builds a model (``model_class(config)``, ``from_pretrained``) runs
on ours. Only the outermost construction is patched (a ViTForImageClassification builds a ViTModel inside).
Each patched model is noted for the launch counter (launches.py, loaded with ``-p vit_fast_peer_launches``): a
suite that patched a model with backend "triton" must have launched our kernels.
"""

from __future__ import annotations

import functools
import os

import transformers
from vit_fast_peer_launches import note_patched  # tools/peers/launches.py, copied beside this file

MODE = os.environ.get("VIT_FAST_PEERS", "none")
BACKEND = os.environ.get("VIT_FAST_PEERS_BACKEND", "auto")
_depth = [0]


def _wrap(cls):
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        _depth[0] += 1
        try:
            original(self, *args, **kwargs)
        finally:
            _depth[0] -= 1
        if _depth[0] or type(self) is not cls:
            return
        import vit_fast

        if MODE == "apply":
            vit_fast.apply_vit_fast(self, backend=BACKEND)
        else:
            self.__dict__.update(vit_fast.optimize(self, backend=BACKEND).__dict__)
        note_patched()

    cls.__init__ = __init__


if MODE in ("apply", "optimize"):
    from vit_fast.interop.hf_classes import SUPPORTED

    for names in SUPPORTED.values():
        for name in names:
            _wrap(getattr(transformers, name))
elif MODE != "none":
    raise SystemExit(f"VIT_FAST_PEERS must be none, apply or optimize, got {MODE!r}")


def pytest_report_header(config):
    return f"vit-fast peers: VIT_FAST_PEERS={MODE} VIT_FAST_PEERS_BACKEND={BACKEND}"
