"""The repository's layout and its all-or-nothing writer: ``REPO/NAME/config.pbtxt``, ``REPO/NAME/verification.json``
and ``REPO/NAME/1/`` (the model files), built in a staging folder and moved into place together
(:func:`write_repository`); :func:`check_repository` refuses what it would overwrite before any work."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_fast.util.files import (
    MANIFEST_NAME,
    check_output_dir,
    claim_folder,
    clean_stale_staging,
    foreign_entries,
    link_entries,
    make_folders,
    make_staging,
    publish_folders,
    read_json_object,
    refuse_non_utf8,
    user_paths,
    write_manifest,
    write_new,
)
from vit_fast.util.progress import Stages
from vit_fast.util.version import __version__

from .checks import check_model_name
from .config import VERSION, EntryConfig

#: what a build writes at the top of a model folder: a file of someone else's there is never replaced
BUILT_NAMES = ("config.pbtxt", "verification.json", MANIFEST_NAME, VERSION)


@dataclass
class ModelEntry:
    """One model folder to write: ``build(folder)`` writes its files under ``folder`` (the version folder
    ``folder/1`` included) and returns its config; :func:`write_repository` does the rest."""

    name: str
    build: Callable[[Path], EntryConfig]


def published_folder(folder: Path) -> Path:
    """Where a model folder that :func:`write_repository` builds at ``folder`` (inside its staging folder in the
    repository) is published: what progress lines and tables name, never the staging path."""
    return folder.parent.parent / folder.name


def check_repository(repo: str | os.PathLike, names: Sequence[str], force: bool = False) -> Path:
    """Check that ``repo`` can hold the model folders ``names`` (before any work); returns it. ``repo`` may be missing
    (made with the folders above it); its nearest existing folder must be writable, no link on the way dangling. A
    model folder that is not empty is refused unless ``force``, and even then where a file vit-fast did not write is
    in the way (:func:`kept_entries`); duplicate names are refused. Each model folder is claimed (``claim_folder``)."""
    repo = Path(repo)
    refuse_non_utf8(repo, "model repository", "ONNX Runtime (verifying the model where it will be served from)")
    if repo.exists() and not repo.is_dir():
        raise ValueError(f"model repository {str(repo)!r} is a file; give a folder")
    check_output_dir(repo, "model repository")  # a link that leads nowhere, a folder that cannot be written
    if len(set(names)) != len(names):
        raise ValueError(f"model names must differ, got {list(names)}")
    for name in names:
        check_model_name(name)
        target = repo / name
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise ValueError(f"{str(target)!r} exists and is not a folder: remove it or pick another model name")
        if target.is_dir() and any(target.iterdir()) and not force:
            raise FileExistsError(
                f"model folder {str(target)!r} exists and is not empty: pass force (--force) to replace what vit-fast "
                "wrote there, or pick another name or repository"
            )
        if target.is_dir():
            kept_entries(target)
    for name in names:
        claim_folder(repo / name)
    return repo


def kept_entries(target: Path) -> list[tuple[str, str]]:
    """What ``--force`` keeps in the existing model folder ``target``: every entry vit-fast did not write as it is
    now (:func:`vit_fast.util.files.foreign_entries`), as (relative path, why). Raises FileExistsError, naming
    them, when any lies where a build writes (config.pbtxt, the version folder ...): --force never replaces it."""
    foreign = foreign_entries(target)
    in_the_way = [f"{rel!r} ({why})" for rel, why in foreign if rel.split("/")[0] in BUILT_NAMES]
    if in_the_way:
        raise FileExistsError(
            f"model folder {str(target)!r} holds {', '.join(in_the_way)} where vit-fast writes; --force replaces only "
            "the files vit-fast wrote there: move those away yourself, or pick another name or repository"
        )
    return foreign


def _kept_note(target: Path, kept: list[tuple[str, str]]) -> str:
    names = ", ".join(rel for rel, _ in kept)
    note = f"kept in {target} (vit-fast did not write them, --force leaves them as they are): {names}"
    versions = sorted(int(rel[:-1]) for rel, _ in kept if rel[:-1].isdigit() and rel.endswith("/"))
    if versions and versions[-1] > int(VERSION):
        note += (
            f"; Triton serves the highest version folder by default: {versions[-1]}/, not the {VERSION}/ written now"
        )
    return note


def write_repository(
    repo: str | os.PathLike, entries: Sequence[ModelEntry], force: bool = False, progress: bool = True
) -> list[Path]:
    """Build each entry's model folder in a staging folder inside ``repo``, then move them all into place; returns
    the model folders. Nothing appears in ``repo`` unless every entry was built. With ``force`` an existing model
    folder of the same name is swapped out, but only while it is as :func:`check_repository` saw it, else
    :class:`vit_fast.util.files.OutputChanged` and nothing published. See docs/development.md, section The Triton
    model repository."""
    names = [e.name for e in entries]
    repo = check_repository(repo, names, force)
    make_folders(repo, "model repository")
    stages = Stages("vit-fast export", progress)
    clean_stale_staging(repo)  # a killed run's staging folder, proven ours by its marker and free lock
    staging, lock = make_staging(repo, "vit-fast-repo")  # .vit-fast-repo.tmp-TOKEN
    # --force: what vit-fast did not write, as checked before the work; a change meanwhile fails the publish's claim
    kept = {e.name: kept_entries(repo / e.name) for e in entries if (repo / e.name).is_dir()}
    try:
        with user_paths(staging, repo):  # a full disk names the user's model folders, not the staging
            for entry in entries:
                folder = staging / entry.name
                folder.mkdir()
                with stages.step(f"building model folder {entry.name!r}"):
                    config = entry.build(folder)
                if config.name != entry.name:
                    raise RuntimeError(f"entry {entry.name!r} produced a config named {config.name!r}")
                write_new(folder / "config.pbtxt", config.to_pbtxt())
                write_manifest(folder, __version__)
                if kept.get(entry.name):  # what vit-fast did not write comes along, as the same files
                    link_entries(repo / entry.name, folder, [rel for rel, _ in kept[entry.name]])
            # the folders replaced end up inside the staging folder, and go with them only vit-fast's own files
            publish_folders([(staging / e.name, repo / e.name) for e in entries])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(lock)
    published = [repo / e.name for e in entries]
    for target in published:
        stages.note(f"wrote {target}/config.pbtxt")
        if kept.get(target.name):  # said even with --quiet: the user's files were left beside ours
            print(f"[vit-fast export] {_kept_note(target, kept[target.name])}", file=sys.stderr)
    return published


def repository_summary(repo: Path, folders: list[Path]) -> dict[str, Any]:
    """What a written repository holds, for ``--json``: each model folder, its files, what in it is not vit-fast's
    (``kept``) and its verification."""
    models = []
    for folder in folders:
        record_path = folder / "verification.json"
        record = read_json_object(record_path) or {}
        models.append(
            {
                "name": folder.name,
                "folder": str(folder),
                "config": str(folder / "config.pbtxt"),
                "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
                "kept": [rel for rel, _ in foreign_entries(folder)],  # not vit-fast's: --force left them
                "verified": record.get("passed"),
                "verification_note": record.get("note"),
            }
        )
    return {"repository": str(repo.resolve()), "models": models}
