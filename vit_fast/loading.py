"""The one place that resolves a model name, for the CLI and ``vit_fast.load_model``.

    default | embedded                     the embedded digits model (its file's sha256 recorded)
    PRESET                                 a preset architecture with RANDOM weights (seeded; recorded
                                           as ``random (seed N)``); ``preset:NAME`` says so explicitly
    FILE.safetensors|.pth|.pt|.bin|.ckpt   a checkpoint: vit-fast's own (config inside), or a timm /
                                           Hugging Face state dict with ``config=`` (a preset name or a
                                           config.json; key layouts are detected)
    FOLDER                                 a Hugging Face ``save_pretrained`` folder (config.json + weights)
    timm:NAME[.TAG]                        a timm model; pretrained weights from ``weights=FILE`` when
                                           given (nothing is downloaded), else from the hub
    hf:ORG/NAME                            a Hugging Face hub model (from its cache, else the hub)

A name that is not a preset and has a ``.tag`` or is a timm model name goes to timm. A hub that
cannot be reached fails in seconds with the reason, instead of retrying for half a minute.
"""

from __future__ import annotations

import os
import pickle
import socket
from pathlib import Path
from urllib.parse import urlparse

import torch

from .checkpoints import (
    LOAD_SUFFIXES,
    _hf_config_dict_to_vit,
    file_sha256,
    load_checkpoint,
    resolve_config,
    torch_load_error,
)
from .config import PRESETS, ViTConfig
from .convert import from_hf, from_timm
from .files import read_json
from .model import VisionTransformer

PREFIXES = ("preset:", "timm:", "hf:")
_HUB_PROBE_TIMEOUT_S = 3.0


def _hub_reachable(kind: str) -> str | None:
    """None when the hub answers a TCP connect within a few seconds, else the reason."""
    if kind == "hf" and os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        return "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=_HUB_PROBE_TIMEOUT_S).close()
    except OSError as err:
        return f"{host} cannot be reached ({err.strerror or err})"
    return None


def _offline_error(what: str, reason: str, fix: str) -> ValueError:
    return ValueError(f"cannot download {what}: {reason}. {fix}")


def _random_preset(name: str, backend: str, seed: int) -> VisionTransformer:
    with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's RNG
        torch.manual_seed(seed)
        model = VisionTransformer(ViTConfig.from_name(name), backend=backend)
    model.weights_source = {"kind": "random", "seed": seed, "preset": name}
    return model.eval()


def _timm_model(name: str, backend: str, weights: str | os.PathLike | None) -> VisionTransformer:
    from .timm_import import import_timm

    try:
        timm = import_timm()
    except ImportError as err:
        missing = getattr(err, "name", None) or "timm"
        raise ImportError(
            f"timm model {name!r} needs timm, which cannot be imported here ({err}): pip install {missing}"
        ) from err
    arch = name.split(".", 1)[0]
    if not timm.is_model(arch):
        raise ValueError(f"{arch!r} is not a timm model name (timm {timm.__version__}); see timm.list_models('vit_*')")
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            raise FileNotFoundError(f"weights file {str(path)!r} for timm model {name!r} does not exist")
        # timm reads the local file instead of the hub: nothing is downloaded
        ref = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
        model = from_timm(ref, backend=backend)
        model.weights_source = {"kind": "file", "file": path.name, "sha256": file_sha256(path), "layout": "timm"}
        return model.eval()
    reason = _hub_reachable("timm")
    if reason:
        raise _offline_error(
            f"pretrained weights for timm model {name!r}",
            reason,
            f"Pass a local weights file (Python: weights=...; command line: --weights FILE), or use the preset "
            f"{arch!r} for random weights"
            if arch in PRESETS
            else "Pass a local weights file (--weights FILE)",
        )
    model = from_timm(timm.create_model(name, pretrained=True), backend=backend)
    model.weights_source = {"kind": "timm", "name": name}
    return model.eval()


def _hf_model(spec: str, backend: str) -> VisionTransformer:
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForImageClassification
    except ImportError as err:
        raise ImportError(f"Hugging Face model {spec!r} needs transformers: pip install transformers ({err})") from err
    local = Path(spec).is_dir()
    if not local:
        try:  # the local cache first: no network at all when the model was downloaded before
            AutoConfig.from_pretrained(spec, local_files_only=True)
            local_only = True
        except OSError:
            local_only = False
        if not local_only:
            reason = _hub_reachable("hf")
            if reason:
                raise _offline_error(
                    f"Hugging Face model {spec!r}", reason, "Pass a save_pretrained folder or a weights file instead"
                )
    else:
        local_only = True
        config_file = Path(spec) / "config.json"
        try:  # bounded, and wrong JSON types named by file and field, before transformers reads it whole
            data = read_json(config_file, "Hugging Face config")
        except OSError as err:
            raise ValueError(f"Hugging Face config {str(config_file)!r} cannot be read: {err.strerror or err}") from err
        if not isinstance(data, dict):
            raise ValueError(f"Hugging Face config {str(config_file)!r} holds a {type(data).__name__}, not an object")
        _hf_config_dict_to_vit(data, repr(str(config_file)))  # types, sizes and memory, before anything is built
    hf_config = AutoConfig.from_pretrained(spec, local_files_only=local_only)
    if not local:  # a hub model's config: the same checks before transformers builds it
        _hf_config_dict_to_vit(hf_config.to_dict(), repr(spec))
    archs = getattr(hf_config, "architectures", None) or []
    # a classification checkpoint keeps its head; anything else loads as the bare encoder
    loader = AutoModelForImageClassification if any("ImageClassification" in a for a in archs) else AutoModel
    try:
        loaded = loader.from_pretrained(spec, local_files_only=local_only)
    except pickle.UnpicklingError as err:  # transformers' torch.load(weights_only=True) of a pickled .bin
        weights = next((p for p in Path(spec).glob("*.bin")), Path(spec)) if local else Path(spec)
        raise torch_load_error(weights, err) from None
    model = from_hf(loaded, backend=backend)
    if local:  # every weight file transformers may have read, hashed as a checkpoint file is
        folder = Path(spec)
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in HF_WEIGHT_SUFFIXES)
        model.weights_source = {
            "kind": "hf-folder",
            "name": folder.name,
            "files": {p.name: file_sha256(p) for p in files},
        }
    return model.eval()


#: the weight files of a Hugging Face save_pretrained folder (sharded or not): hashed into weights_source
HF_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")


def source_name(spec: str) -> str:
    """How metadata names a model: ``default``, presets and hub names as given, files by absolute path."""
    if spec in PRESETS or spec in ("default", "embedded") or not Path(spec).exists():
        return spec
    return str(Path(spec).resolve())


def load_model(
    spec: str,
    backend: str = "auto",
    seed: int = 0,
    config: ViTConfig | str | os.PathLike | None = None,
    weights: str | os.PathLike | None = None,
) -> VisionTransformer:
    """A model by name (see the module docstring for every form). ``config`` describes a plain timm /
    Hugging Face state dict file; ``weights`` gives a ``timm:`` model its pretrained weights from a file."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            "model name is empty: give 'default', a preset name, a checkpoint file, a Hugging Face folder, "
            "timm:NAME or hf:ORG/NAME"
        )
    spec = spec.strip()
    if weights is not None and not spec.startswith("timm:") and spec in PRESETS:
        spec = "timm:" + spec  # a preset architecture with given weights is timm's model of that name
    if spec in ("default", "embedded"):
        from .assets import WEIGHTS_FILE, load_default_model

        model = load_default_model(backend=backend)
        model.weights_source = {"kind": "file", "file": WEIGHTS_FILE.name, "sha256": file_sha256(WEIGHTS_FILE)}
        return model
    if spec.startswith("preset:") or spec in PRESETS:
        return _random_preset(spec.removeprefix("preset:"), backend, seed)
    if spec.startswith("timm:"):
        return _timm_model(spec.removeprefix("timm:"), backend, weights)
    if spec.startswith("hf:"):
        return _hf_model(spec.removeprefix("hf:"), backend)
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"folder {spec!r} has no config.json: give a Hugging Face save_pretrained folder or a checkpoint file"
            )
        return _hf_model(spec, backend)
    if path.exists() and not path.is_file():  # a FIFO, socket or device: refused unopened
        raise ValueError(f"model {spec!r} is not a regular file: give a checkpoint file or a Hugging Face folder")
    if path.suffix.lower() in LOAD_SUFFIXES or path.is_file():
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {spec!r} does not exist")
        if config is not None:
            resolve_config(config)  # a bad config is named before the weights are read
        return load_checkpoint(path, cfg=config, backend=backend).eval()
    if weights is not None or "." in spec:
        return _timm_model(spec, backend, weights)
    from .timm_import import import_timm

    try:
        timm = import_timm()
    except ImportError:  # not installed: then a plain name cannot be timm's
        timm = None
    if timm is not None and timm.is_model(spec):
        return _timm_model(spec, backend, weights)
    import difflib

    close = difflib.get_close_matches(spec, list(PRESETS), n=2)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(
        f"cannot resolve model {spec!r}{hint}: not 'default', a preset ({', '.join(sorted(PRESETS))}), an existing "
        "checkpoint file or Hugging Face folder"
        + ("" if timm is None else ", or a timm model name")
        + "; use timm:NAME or hf:ORG/NAME for hub models"
    )
