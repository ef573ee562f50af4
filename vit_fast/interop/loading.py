"""The one place that resolves a model name, for the CLI and ``vit_fast.load_model``.

:func:`load_model` takes ``default``, a preset (random, seeded weights), a checkpoint file, a Hugging Face folder,
``timm:NAME[.TAG]`` or ``hf:ORG/NAME``; hubs fail fast when unreachable, and nothing touches the network with
``HF_HUB_OFFLINE``; no model's own code runs. Every form: docs/usage.md, "Where weights come from"."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import torch

from vit_fast.interop.checkpoints import (
    LOAD_SUFFIXES,
    check_weights_file,
    file_sha256,
    load_checkpoint,
    torch_load_error,
)
from vit_fast.interop.configs import check_hf_model_type, hf_config_dict_to_vit, resolve_config
from vit_fast.interop.convert import from_hf, from_timm
from vit_fast.model.config import PRESETS, ViTConfig
from vit_fast.model.vit import VisionTransformer
from vit_fast.util.files import read_json

PREFIXES = ("preset:", "timm:", "hf:")
_HUB_PROBE_TIMEOUT_S = 3.0


def hub_offline() -> bool:
    """Whether the environment asks for no network, read as huggingface_hub reads it (``HF_HUB_OFFLINE``, else
    ``TRANSFORMERS_OFFLINE``: 1, ON, YES or TRUE), at the moment of the call (huggingface_hub reads it once, at
    import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


@contextlib.contextmanager
def _offline_passed_on() -> Iterator[None]:
    """While a hub model loads, huggingface_hub sees the offline switch as it is now. It reads ``HF_HUB_OFFLINE``
    once, at import, and when it believes it is online even a cache lookup (``local_files_only=True``) reaches the
    hub (its user-agent header fetches a list of agent harnesses): a switch set after that import
    (``os.environ`` in a notebook) would not keep the network untouched."""
    if not hub_offline():
        yield
        return
    try:
        from huggingface_hub import constants
    except ImportError:  # neither timm's hub loading nor transformers without it
        yield
        return
    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def _hub_reachable() -> str | None:
    """None when the hub answers a TCP connect within a few seconds, else the reason; offline, the reason without
    a connect (nor a DNS lookup)."""
    if hub_offline():
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


def _timm_cached_weights(timm, name: str) -> Path | None:
    """The file timm would download for ``name``'s pretrained weights (its hub id; safetensors first, as timm
    reads them), found in the local Hugging Face cache without any network; None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except RuntimeError:  # an unknown tag: timm says so when it builds the model
        return None
    hub_id = getattr(cfg, "hf_hub_id", None)
    if not hub_id:
        return None
    repo, _, revision = hub_id.partition("@")
    filename = getattr(cfg, "hf_hub_filename", None) or "pytorch_model.bin"
    # timm's safe alternatives (timm.models._hub): pytorch_model.bin -> model.safetensors, NAME.bin -> NAME.safetensors
    safe = {"pytorch_model.bin": "model.safetensors", "open_clip_pytorch_model.bin": "open_clip_model.safetensors"}
    for candidate in (safe.get(filename, filename.removesuffix(".bin") + ".safetensors"), filename):
        found = try_to_load_from_cache(repo, candidate, revision=revision or None)
        if isinstance(found, str):
            return Path(found)
    return None


@_offline_passed_on()
def _timm_model(name: str, backend: str, weights: str | os.PathLike | None) -> VisionTransformer:
    from vit_fast.interop.timm_import import import_timm

    try:
        timm = import_timm(note=False)  # the torchvision note, if any, comes when timm builds the model
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
        if path.suffix.lower() in LOAD_SUFFIXES:  # vit-fast's refusals (a pickled file, a cut-off one) come first,
            check_weights_file(path)  # in its words: timm's would advise weights_only=False, which vit-fast never does
        import_timm()  # the torchvision note, where timm's model code runs through the stand-in
        # timm reads the local file instead of the hub: nothing is downloaded
        ref = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
        model = from_timm(ref, backend=backend)
        model.weights_source = {"kind": "file", "file": path.name, "sha256": file_sha256(path), "layout": "timm"}
        return model.eval()
    fix = (
        f"Pass a local weights file (Python: weights=...; command line: --weights FILE), or use the preset {arch!r} "
        "for random weights"
        if arch in PRESETS
        else "Pass a local weights file (--weights FILE)"
    )
    if hub_offline():  # timm would ask the hub (huggingface_hub may have read the switch before it was set)
        cached = _timm_cached_weights(timm, name)
        if cached is None:
            raise _offline_error(
                f"pretrained weights for timm model {name!r}",
                "HF_HUB_OFFLINE is set and they are not in the local Hugging Face cache",
                fix,
            )
        import_timm()  # the torchvision note, where timm's model code runs through the stand-in
        model = from_timm(
            timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(cached)}), backend=backend
        )
        model.weights_source = {"kind": "timm", "name": name}
        return model.eval()
    reason = _hub_reachable()
    if reason:
        raise _offline_error(f"pretrained weights for timm model {name!r}", reason, fix)
    import_timm()  # the torchvision note, where timm's model code runs through the stand-in
    model = from_timm(timm.create_model(name, pretrained=True), backend=backend)
    model.weights_source = {"kind": "timm", "name": name}
    return model.eval()


def refuse_remote_code(data: dict, where: str) -> None:
    """Refuse a Hugging Face config (``data``, from ``where``) whose ``auto_map`` names Python shipped with the
    model: transformers would offer to run it (a prompt on a terminal, the folder's code on "y"); vit-fast never
    runs a model's own code."""
    auto_map = data.get("auto_map")
    if not auto_map:
        return
    names = ", ".join(f"{k}: {v}" for k, v in auto_map.items()) if isinstance(auto_map, dict) else repr(auto_map)
    raise ValueError(
        f"{where} names its own Python code in config.json's auto_map ({names[:200]}): vit-fast never runs a "
        "model's code (transformers is called with trust_remote_code=False), and takes standard transformers "
        "ViT models; give the folder or hub name of one, or, if this model is a standard ViT, remove auto_map "
        "from its config.json"
    )


@_offline_passed_on()
def _hf_model(spec: str, backend: str) -> VisionTransformer:
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForImageClassification, PretrainedConfig
    except ImportError as err:
        raise ImportError(f"Hugging Face model {spec!r} needs transformers: pip install transformers ({err})") from err
    local = Path(spec).is_dir()
    if not local:
        where = f"Hugging Face model {spec!r}"
        try:  # the local cache first: no network at all when the model was downloaded before
            data, _ = PretrainedConfig.get_config_dict(spec, local_files_only=True)
            local_only = True
        except OSError:
            local_only = False
        if not local_only:
            reason = _hub_reachable()
            if reason:
                raise _offline_error(where, reason, "Pass a save_pretrained folder or a weights file instead")
            data, _ = PretrainedConfig.get_config_dict(spec)  # config.json alone, read before any class is chosen
    else:
        local_only = True
        config_file = Path(spec) / "config.json"
        where = f"Hugging Face folder {spec!r}"
        try:  # bounded, and wrong JSON types named by file and field, before transformers reads it whole
            data = read_json(config_file, "Hugging Face config")
        except OSError as err:
            raise ValueError(f"Hugging Face config {str(config_file)!r} cannot be read: {err.strerror or err}") from err
        if not isinstance(data, dict):
            raise ValueError(f"Hugging Face config {str(config_file)!r} holds a {type(data).__name__}, not an object")
        hf_config_dict_to_vit(data, repr(str(config_file)))  # types, sizes and memory, before anything is built
        check_hf_index_files(Path(spec))
    refuse_remote_code(data, where)
    check_hf_model_type(data, where, NATIVE_HF_TYPES)  # a BertModel is never loaded only to be refused after
    # trust_remote_code=False as well: transformers never prompts, whatever it finds
    hf_config = AutoConfig.from_pretrained(spec, local_files_only=local_only, trust_remote_code=False)
    if not local:  # a hub model's config: the same checks before transformers builds it
        hf_config_dict_to_vit(hf_config.to_dict(), repr(spec))
    archs = getattr(hf_config, "architectures", None) or []
    # a classification checkpoint keeps its head; anything else loads as the bare encoder
    loader = AutoModelForImageClassification if any("ImageClassification" in a for a in archs) else AutoModel
    try:
        loaded = loader.from_pretrained(spec, local_files_only=local_only, trust_remote_code=False)
    except pickle.UnpicklingError as err:  # transformers' torch.load(weights_only=True) of a pickled .bin
        weights = next((p for p in Path(spec).glob("*.bin")), Path(spec)) if local else Path(spec)
        # converted beside it as model.safetensors, the file transformers reads first
        raise torch_load_error(weights, err, weights.with_name("model.safetensors")) from None
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
#: the index files of a sharded save_pretrained folder; transformers opens each file their weight_map names
HF_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def check_hf_index_files(folder: Path) -> None:
    """Refuse (ValueError naming the index, the entry and the name) a weight file that an index in ``folder``
    names outside it: transformers joins each name to the folder as it stands (an absolute name replaces
    the folder). A hub snapshot links its files into the cache's blobs, so links may lead out; names may not."""
    from vit_fast.util.files import contained_path, read_json_object

    for index_name in HF_INDEX_FILES:
        index = folder / index_name
        if not index.is_file():
            continue
        data = read_json_object(index)
        weight_map = data.get("weight_map") if data is not None else None
        if not isinstance(weight_map, dict):
            raise ValueError(
                f"weights index {str(index)!r} has no weight_map object (not a readable JSON object with one): "
                "write it again with save_pretrained, or remove it with its shards"
            )
        for key, name in weight_map.items():
            contained_path(folder, name, source=index, field=f"weight_map[{key!r}]", links_may_leave=True)


def source_name(spec: str) -> str:
    """How metadata names a model: ``default``, presets and hub names as given, files by absolute path."""
    if spec in PRESETS or spec in ("default", "embedded") or not Path(spec).exists():
        return spec
    return str(Path(spec).resolve())


#: Hugging Face ``model_type`` values of native-resolution towers, loaded as they are (not converted)
NATIVE_HF_TYPES = ("siglip2_vision_model",)


def load_native_model(spec: str | os.PathLike, weights: str | os.PathLike | None = None) -> torch.nn.Module | None:
    """A native-resolution tower that ``spec`` names, loaded as its library defines it (it has no VisionTransformer
    form: ``vit_fast.export.to_onnx`` exports it as it is), or None for anything else: ``timm:naflexvit_*`` (or the bare
    name) with ``weights=FILE``, timm's ``NaFlexVit`` reading the file (nothing downloaded; checked as any weights file
    is); a ``save_pretrained`` folder whose config.json says ``model_type`` ``siglip2_vision_model``, transformers'
    ``Siglip2VisionModel`` (``trust_remote_code=False``; an ``auto_map`` refused first)."""
    spec = os.fspath(spec).strip()
    arch = spec.removeprefix("timm:").split(".", 1)[0]
    if arch.startswith("naflexvit_"):
        if weights is None:
            raise ValueError(
                f"timm model {arch!r} is exported as timm builds it, from a local weights file: pass --weights FILE "
                "(Python: weights=...)"
            )
        from vit_fast.interop.timm_import import import_timm

        timm = import_timm()
        path = Path(weights)
        if not path.is_file():
            raise FileNotFoundError(f"weights file {str(path)!r} for timm model {arch!r} does not exist")
        if path.suffix.lower() in LOAD_SUFFIXES:
            check_weights_file(path)
        name = spec.removeprefix("timm:")
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
        model.weights_source = {"kind": "file", "file": path.name, "sha256": file_sha256(path), "layout": "timm"}
        return model.eval()
    config_file = Path(spec) / "config.json"
    if not config_file.is_file():
        return None
    data = read_json(config_file, "Hugging Face config")
    if not isinstance(data, dict) or data.get("model_type") not in NATIVE_HF_TYPES:
        return None
    refuse_remote_code(data, f"Hugging Face folder {spec!r}")
    from transformers import Siglip2VisionModel

    model = Siglip2VisionModel.from_pretrained(spec, local_files_only=True, trust_remote_code=False)
    model.weights_source = {"kind": "folder", "folder": Path(spec).name}
    return model.eval()


def load_default_model(backend: str = "auto"):
    """The embedded digits ViT (fp32, CPU, eval mode) with the given backend: ``vit_fast/assets``' weights."""
    from vit_fast.assets import WEIGHTS_FILE

    if not WEIGHTS_FILE.is_file():
        raise FileNotFoundError(
            f"{WEIGHTS_FILE} is missing: run `python -m vit_fast.interop.training --out vit_fast/assets`"
        )
    return load_checkpoint(WEIGHTS_FILE, backend=backend).eval()


def load_model(
    spec: str | os.PathLike,
    backend: str = "auto",
    seed: int = 0,
    config: ViTConfig | str | os.PathLike | None = None,
    weights: str | os.PathLike | None = None,
) -> VisionTransformer:
    """A model by name (every form: docs/usage.md, "Where weights come from"). ``config`` describes a plain timm /
    Hugging Face state dict file; ``weights`` gives a ``timm:`` model its pretrained weights from a file."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(
            f"load_model takes a model name or path (a str or os.PathLike), got {type(spec).__name__} {spec!r:.80}: "
            "give 'default', a preset name, a checkpoint file, a Hugging Face folder, timm:NAME or hf:ORG/NAME"
        )
    if not spec.strip():
        raise ValueError(
            "model name is empty: give 'default', a preset name, a checkpoint file, a Hugging Face folder, "
            "timm:NAME or hf:ORG/NAME"
        )
    spec = spec.strip()
    if weights is not None and not spec.startswith("timm:") and spec in PRESETS:
        spec = "timm:" + spec  # a preset architecture with given weights is timm's model of that name
    if spec in ("default", "embedded"):
        from vit_fast.assets import WEIGHTS_FILE

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
    from vit_fast.interop.timm_import import import_timm

    try:
        timm = import_timm(note=False)  # a look-up: the torchvision note waits until timm builds the model
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
