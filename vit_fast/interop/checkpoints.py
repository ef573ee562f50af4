"""Checkpoint files: ``save_checkpoint`` / ``load_checkpoint`` / ``read_state_dict``.

``.safetensors`` (preferred) keeps the config in the file's metadata; ``.pth`` / ``.pt`` hold ``{"state_dict": ...,
"config": {...}}`` written with ``torch.save``, read back with ``weights_only=True``. Configs are read by
``vit_fast.interop.configs``, foreign key layouts (Hugging Face) converted by ``vit_fast.interop.convert``."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

import torch

from vit_fast.interop.configs import config_from_fields, resolve_config
from vit_fast.interop.convert import convert_hf_state_dict
from vit_fast.interop.weights import grid_from_pos_embed, load_converted
from vit_fast.model.config import PRESETS, ViTConfig
from vit_fast.model.vit import VisionTransformer
from vit_fast.util.files import (
    check_output_file,
    loads_json,
    open_new,
    publish_to,
    read_head,
    refuse_non_utf8,
    staging_dir,
    write_new,
)

CONFIG_METADATA_KEY = "vit_fast_config"
#: set_input_normalization's per-channel mean and std (0..1 units) as JSON, when the model normalises uint8 input
NORMALIZATION_METADATA_KEY = "vit_fast_input_normalization"
#: suffixes save_checkpoint writes, and the format each gets
SAVE_FORMATS = {".safetensors": "safetensors", ".pth": "torch", ".pt": "torch"}
#: suffixes read_state_dict reads
LOAD_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")


def _looks_hf(keys: list[str]) -> bool:
    return any(k.startswith(("vit.", "embeddings.", "encoder.layer.", "layers.")) for k in keys)


def is_vit_fast_checkpoint(path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` itself proves it is a checkpoint :func:`save_checkpoint` wrote: a
    safetensors file whose header metadata holds vit-fast's config, or a torch file holding
    ``{"state_dict", "config"}`` (read with ``weights_only=True``). Only regular files are read."""
    path = Path(path)
    head = read_head(path, 8)
    if head is None or len(head) < 8:
        return False
    if path.suffix.lower() == ".safetensors":
        size = int.from_bytes(head, "little")
        raw = read_head(path, 8 + min(size, 100 * 2**20))
        try:
            header = loads_json(raw[8:], f"the safetensors header of {str(path)!r}")
        except (TypeError, ValueError):
            return False
        return isinstance(header, dict) and CONFIG_METADATA_KEY in (header.get("__metadata__") or {})
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a torch file, or not one weights_only reads: not provably ours
        return False
    return isinstance(obj, Mapping) and isinstance(obj.get("config"), Mapping) and "state_dict" in obj


def save_checkpoint(
    model: VisionTransformer,
    path: str | os.PathLike,
    extra: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the weights and the config (atomically) so that :func:`load_checkpoint` restores the model.
    ``.safetensors`` (preferred): the config in the file's metadata; ``.pth`` / ``.pt``: ``torch.save({"state_dict":
    ..., "config": ..., "metadata": extra})``, readable with ``weights_only=True``; any other suffix is refused before
    anything is written. An existing file is replaced only when vit-fast wrote it (:func:`is_vit_fast_checkpoint`) or
    with ``overwrite=True``. It is written in a private staging folder beside ``path``, then renamed into place."""
    path = Path(path)
    fmt = SAVE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"save_checkpoint cannot tell the format of {str(path)!r} from its suffix {path.suffix!r}: "
            f"name it {path.stem}.safetensors (preferred) or {path.stem}.pth"
        )
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"save_checkpoint saves a vit_fast.VisionTransformer, got {type(model).__name__}")
    if path.is_dir() and not path.is_symlink():
        raise ValueError(
            f"checkpoint path {str(path)!r} is a folder: give a file path such as {str(path / 'w.safetensors')!r}"
        )
    if not path.parent.is_dir():
        raise ValueError(f"folder {str(path.parent)!r} for checkpoint {str(path)!r} does not exist: create it first")
    check_output_file(path, tuple(SAVE_FORMATS), "checkpoint", ours=is_vit_fast_checkpoint, overwrite=overwrite)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    extra = dict(extra or {})
    if model.input_mean is not None:  # not in the state_dict (non-persistent buffers): saved beside the config
        extra[NORMALIZATION_METADATA_KEY] = json.dumps(
            {"mean": model.input_mean.tolist(), "std": model.input_std.tolist()}
        )
    with staging_dir(path) as tmp:
        staged = tmp / path.name
        if fmt == "safetensors":
            from safetensors.torch import save

            write_new(staged, save(tensors, {CONFIG_METADATA_KEY: model.cfg.to_json(), **(extra or {})}))
        else:
            with open_new(staged) as f:
                torch.save({"state_dict": tensors, "config": model.cfg.to_dict(), "metadata": dict(extra or {})}, f)
        publish_to([(staged, path)])
    return path


#: how a file starts, by format: a torch.save zip archive, a legacy torch.save / plain pickle (PROTO 2 to 5)
_ZIP_MAGIC, _PICKLE_MAGIC = b"PK\x03\x04", b"\x80"


def _file_kind(path: Path) -> str:
    """What ``path`` holds by its first bytes, never by its suffix: "empty", "safetensors" (a little-endian
    header length, then a JSON object), "torch" (a zip archive or a pickle) or "unknown"."""
    size = path.stat().st_size
    if size == 0:
        return "empty"
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"  # first: a header length may itself start with 0x80
    if head.startswith(_ZIP_MAGIC) or (len(head) > 1 and head[:1] == _PICKLE_MAGIC and 2 <= head[1] <= 5):
        return "torch"
    return "unknown"


def safetensors_command(path: Path, out: Path) -> str:
    """A shell command that converts the torch.save file ``path`` into the safetensors file ``out``: it unpickles
    ``path`` (``weights_only=False``, which runs whatever code the file holds: for the user to run, on a file they
    trust, never vit-fast) and saves the tensors of its state dict (a whole module's, or the one under
    ``state_dict`` / ``model`` / ``module``)."""
    source, target = json.dumps(str(path)), json.dumps(str(out))  # Python string literals in double quotes
    code = (
        f'import torch; from safetensors.torch import save_file; obj = torch.load({source}, map_location="cpu", '
        'weights_only=False); obj = next((obj[k] for k in ("state_dict", "model", "module") if isinstance(obj, dict) '
        'and k in obj), obj); obj = obj.state_dict() if hasattr(obj, "state_dict") else obj; save_file({k: '
        "v.detach().clone(memory_format=torch.contiguous_format) for k, v in obj.items() if isinstance(v, "
        f"torch.Tensor)}}, {target})"
    )
    return "python -c " + shlex.quote(code)


#: the packages whose classes a whole-model pickle names: only such a file gets the conversion command
MODEL_MODULES = ("torch", "vit_fast", "timm", "transformers")


def torch_load_error(path: Path, err: Exception, converted: Path | None = None) -> ValueError:
    """torch.load's failure as what is wrong with the file and what to do: never torch's (or timm's) advice to load
    with ``weights_only=False``; for a whole model's pickle (classes of :data:`MODEL_MODULES` only) the command that
    converts a file the user trusts to safetensors (written to ``converted``, default ``path`` with .safetensors)."""
    text = str(err)
    refused = "Weights only load failed" in text or isinstance(err, pickle.UnpicklingError)
    code = re.search(r"GLOBAL ([A-Za-z_][\w.]*) whose module [\w.]+ is blocked", text)
    found = re.search(r"Unsupported (?:global|operand)[^.\n]*?([A-Za-z_][\w.]*\.[A-Za-z_]\w*)", text, re.I)
    if refused and (code is not None or found is None or found.group(1).split(".")[0] not in MODEL_MODULES):
        what = f" ({(code or found).group(1)})" if code or found else ""
        return ValueError(
            f"{str(path)!r} holds Python objects{what} whose unpickling may run code: vit-fast does not load it, nor "
            "should anything unpickle it. Get the weights alone from where the file came from: a .safetensors file "
            "(preferred), or a state_dict saved with torch.save(model.state_dict(), ...), and give that file"
        )
    if refused:  # a whole model's classes (torch, timm, transformers, vit-fast): a file the user may have made
        what = f" ({found.group(1)})"
        out = converted or path.with_suffix(".safetensors")
        return ValueError(
            f"{str(path)!r} holds Python objects besides tensors{what}, which vit-fast does not load: checkpoints "
            "are read with torch.load(weights_only=True) so that a file cannot run code; save the weights alone "
            "(torch.save(model.state_dict(), ...), or a .safetensors file) and load that. If you trust the file, "
            f"convert it once yourself (this runs the code it holds) and give {str(out)!r} instead: "
            f"{safetensors_command(path, out)}"
        )
    first = text.split(". ")[0].strip() or type(err).__name__
    return ValueError(
        f"{str(path)!r} is not a readable PyTorch checkpoint ({first}): the file may be cut short or "
        "damaged; write it again or give another file"
    )


def _torch_load(path: Path, mmap: bool = False) -> object:
    """``torch.load(weights_only=True)`` of a file :func:`_checked_kind` called "torch", with argparse's
    ``Namespace`` allowed (timm's training checkpoints keep their arguments in one; it holds only plain values);
    ``mmap`` maps a zip archive's tensors instead of reading them. A ValueError from :func:`torch_load_error`."""
    import argparse
    import contextlib

    allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
    try:
        with allow([argparse.Namespace]) if allow else contextlib.nullcontext():
            try:
                return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
            except RuntimeError as err:
                if not mmap or "mmap" not in str(err):
                    raise
                return torch.load(str(path), map_location="cpu", weights_only=True)  # a legacy (non-zip) file
    except Exception as err:
        raise torch_load_error(path, err) from err


def _checked_kind(path: Path) -> str:
    """The suffix of a checkpoint file after refusing, by name and before any loader reads it, what is not one: a
    missing file, a FIFO or device, an unknown suffix, an empty file, a file whose first bytes are another format
    than its suffix says, or neither safetensors nor a torch.save archive."""
    if path.exists() and not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} is not a regular file: give a .safetensors or .pth file")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist or is not a file")
    suffix = path.suffix.lower()
    if suffix not in LOAD_SUFFIXES:
        raise ValueError(
            f"unsupported checkpoint type {suffix!r} for {str(path)!r}: vit-fast reads {', '.join(LOAD_SUFFIXES)}"
        )
    kind = _file_kind(path)
    if kind == "empty":
        raise ValueError(f"checkpoint {str(path)!r} is an empty file (0 bytes): write it again or give another file")
    if kind == "safetensors" and suffix != ".safetensors":
        raise ValueError(
            f"{str(path)!r} is a safetensors file with a {suffix} suffix: rename it to "
            f"{path.stem}.safetensors (vit-fast reads a file by the format its suffix names)"
        )
    if kind == "torch" and suffix == ".safetensors":
        raise ValueError(
            f"{str(path)!r} is a PyTorch (torch.save) file with a .safetensors suffix: rename it to {path.stem}.pth"
        )
    if kind == "unknown" and suffix == ".safetensors":
        raise ValueError(
            f"cannot read {str(path)!r} as safetensors: its first bytes are not a safetensors header (a partial "
            "download, or another kind of file); write it again or give another file"
        )
    if kind == "unknown":
        raise ValueError(
            f"{str(path)!r} is not a PyTorch checkpoint: its first bytes are neither a torch.save archive nor a "
            "safetensors header (a partial download, or another kind of file); write it again or give another file"
        )
    return suffix


def check_weights_file(path: str | os.PathLike) -> None:
    """Refuse, with :func:`read_state_dict`'s words, a weights file another loader (timm's) is about to read: the
    same format checks, a safetensors header opened, a torch file unpickled with ``weights_only=True`` (its tensors
    mapped, not read where it is a zip archive). Nothing is kept."""
    path = Path(path)
    if _checked_kind(path) == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                f.metadata()
        except Exception as err:  # safetensors raises its own types for corrupt headers
            raise ValueError(f"cannot read {str(path)!r} as safetensors: {err}") from err
    else:
        _torch_load(path, mmap=True)


def read_state_dict(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and string metadata from a .safetensors file, or a .pth/.pt/.bin loaded with weights_only.
    The first bytes must match the suffix: an empty file, a file of another format, or one that is neither
    safetensors nor a torch.save archive is refused by name before any loader reads it."""
    path = Path(path)
    if _checked_kind(path) == ".safetensors":
        from safetensors import safe_open

        refuse_non_utf8(path, "checkpoint", "safetensors")

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = dict(f.metadata() or {})
                return {k: f.get_tensor(k) for k in f.keys()}, meta
        except Exception as err:  # safetensors raises its own types for corrupt headers
            raise ValueError(f"cannot read {str(path)!r} as safetensors: {err}") from err
    obj = _torch_load(path)
    meta: dict[str, str] = {}
    if isinstance(obj, Mapping):
        if isinstance(obj.get("config"), Mapping):
            try:  # checked as the JSON text of a .safetensors file's config is (vit_fast.util.files.loads_json)
                meta[CONFIG_METADATA_KEY] = json.dumps(dict(obj["config"]))
            except (RecursionError, TypeError, ValueError) as err:  # a crafted file: nested too deep, or not data
                raise ValueError(
                    f"the config in checkpoint {str(path)!r} cannot be read ({type(err).__name__}: nested too deep, "
                    "or not plain data): write the checkpoint again with save_checkpoint, or give another file"
                ) from None
        if isinstance(obj.get("metadata"), Mapping):
            meta.update({str(k): str(v) for k, v in obj["metadata"].items()})
        for key in ("state_dict", "model", "module"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{str(path)!r} does not hold a state dict of tensors")
    return dict(obj), meta


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_checkpoint(
    path: str | os.PathLike, cfg: ViTConfig | str | os.PathLike | None = None, backend: str = "auto"
) -> VisionTransformer:
    """A :class:`VisionTransformer` from a checkpoint in timm or Hugging Face names (detected).

    The config comes from ``cfg`` (a :class:`ViTConfig`, a preset name, or a config.json: vit-fast's, Hugging Face's or
    timm's), else from the file's metadata as :func:`save_checkpoint` writes it. A position embedding saved for another
    image size is resampled to ``cfg``'s. ``weights_source`` records the file's name and SHA-256."""
    state, meta = read_state_dict(path)
    if cfg is not None:
        source = f"config {str(cfg)!r}" if isinstance(cfg, (str, os.PathLike)) else "the config given"
        cfg = resolve_config(cfg)
    else:
        if CONFIG_METADATA_KEY not in meta:
            raise ValueError(
                f"{str(path)!r} carries no vit-fast config (a plain timm or Hugging Face state dict): give its "
                "config, a preset name such as 'vit_base_patch16_224' or a config.json "
                "(Python: load_model(..., config=...), or load_checkpoint(..., cfg=...); "
                f"command line: --config ...); presets: {', '.join(sorted(PRESETS))}"
            )
        source = f"the config embedded in checkpoint {str(path)!r} (not a --config file)"
        fix = "give the right config with --config (Python: cfg=...), which is used instead, or re-save the checkpoint"
        try:
            embedded = loads_json(meta[CONFIG_METADATA_KEY], source)
        except ValueError as err:
            raise ValueError(f"{err}; {fix}") from err
        cfg = config_from_fields(embedded, source, fix)
    layout = "timm"
    if _looks_hf(list(state)):
        try:
            state = convert_hf_state_dict(state)
        except ValueError as err:
            raise ValueError(f"{str(path)!r}: {err}") from None
        layout = "hf"
    src_grid = None
    if "pos_embed" in state:
        keep = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
        if state["pos_embed"].shape[1] != cfg.pos_embed_len:
            src_grid = grid_from_pos_embed(state["pos_embed"], keep)
    model = load_converted(cfg, state, repr(str(path)), src_grid, source).set_backend(backend)
    model.weights_source = {"kind": "file", "file": Path(path).name, "sha256": file_sha256(path), "layout": layout}
    if NORMALIZATION_METADATA_KEY in meta:
        try:
            norm = loads_json(meta[NORMALIZATION_METADATA_KEY], NORMALIZATION_METADATA_KEY)
            model.set_input_normalization(norm["mean"], norm["std"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{str(path)!r}: its input normalisation ({NORMALIZATION_METADATA_KEY}) cannot be read ({err}); "
                "re-save the model with save_checkpoint"
            ) from None
    return model
