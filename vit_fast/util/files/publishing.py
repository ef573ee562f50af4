"""Publishing: staged files and folders moved into place only at the end, each claim re-checked at the move; a
failed set is put back and this run's files kept beside the target (``NAME.unpublished-TOKEN``)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from .base import KEPT_MARK, OWNER_FILE, OutputChanged, current_umask, writing_in
from .claims import Identity, claim_of, claimed_now, folder_tree, identity
from .proof import ownership_note, written_by_vit_fast
from .renames import rename_path
from .staging import STAGING_NAME_RE, fitted_name, is_our_staging


def _changed(target: Path, seen: Identity | None, now: Identity | None, kind: str = "file") -> str:
    if seen is None:
        return f"{str(target)!r} appeared while vit-fast was working (it did not exist when checked)"
    if now is None:
        return f"{str(target)!r} was removed while vit-fast was working"
    return f"{str(target)!r} changed while vit-fast was working (it is not the {kind} checked before the work)"


def _set_aside(folders: Iterable[Path]) -> list[Path]:
    """Turn each staging folder of ``folders`` into a kept folder of results beside it (``NAME.unpublished-TOKEN``,
    ordinary permissions, the marker removed so no cleaner takes it); returns the kept folders."""
    kept = []
    for folder in sorted(set(folders)):
        match = STAGING_NAME_RE.match(folder.name)
        if match is None or not is_our_staging(folder):
            continue
        with contextlib.suppress(OSError):
            for leftover in folder.glob(".previous-*"):
                leftover.unlink()
            (folder / OWNER_FILE).unlink()
            target = folder.parent / fitted_name("", match.group(1), f"{KEPT_MARK}{match.group(2)}")
            rename_path(folder, target, "new")
            os.chmod(target, 0o777 & ~current_umask())
            for f in target.iterdir():
                with contextlib.suppress(OSError):
                    os.chmod(f, 0o666 & ~current_umask())
            kept.append(target)
    return kept


def _kept_text(kept: Sequence[Path]) -> str:
    if not kept:
        return "nothing of this run was published"
    where = ", ".join(repr(str(k)) for k in kept)
    return f"this run's files were kept in {where}: compare, and move them into place yourself, or remove them"


def _swap_in(src: Path, dst: Path, expected: Identity | None) -> Path | None:
    """Replace the file at ``dst`` with ``src`` only while it is ``expected`` (None: whatever it is); returns
    where the replaced file now lies (inside ``src``'s staging folder), or None when ``dst`` had gone meanwhile."""
    try:
        exchanged = rename_path(src, dst, "exchange")
    except FileNotFoundError:  # removed since it was looked at: nothing to replace
        rename_path(src, dst, "new")
        return None
    if exchanged:
        if expected is None or identity(src) == expected:  # exactly the file checked was swapped out
            return src
        rename_path(dst, src, "exchange")  # another file: put it back
        raise OutputChanged(_changed(dst, expected, identity(dst)))
    # no exchange here: keep a second name for the file, compare it, then replace (a change in between is lost)
    keep = src.parent / f".previous-{secrets.token_hex(8)}"
    try:
        os.link(dst, keep, follow_symlinks=False)
        kept_is_it = expected is None or identity(keep) == expected
    except OSError:
        shutil.copy2(dst, keep, follow_symlinks=False)
        kept_is_it = expected is None or identity(dst) == expected
    if not kept_is_it:
        os.unlink(keep)
        raise OutputChanged(_changed(dst, expected, identity(dst)))
    rename_path(src, dst, "replace")
    return keep


def _publish_file(src: Path, dst: Path) -> Path | None:
    """Move one staged file to its target under its claim; returns where the file it replaced now lies."""
    held = claim_of(dst)
    now = identity(dst)
    if held is not None and held.overwrite:
        return _swap_in(src, dst, None) if now is not None else _publish_new(src, dst)
    if now is None:
        return _publish_new(src, dst)
    if held is not None:
        if held.seen != now:
            raise OutputChanged(_changed(dst, held.seen, now))
    elif not written_by_vit_fast(dst):  # never checked: only a file that proves itself ours now is replaced
        raise OutputChanged(
            f"{str(dst)!r} exists, was not checked before the work, and does not prove itself vit-fast's "
            f"({ownership_note(dst)})"
        )
    return _swap_in(src, dst, now)


def _publish_new(src: Path, dst: Path) -> None:
    try:
        rename_path(src, dst, "new")
    except FileExistsError:
        raise OutputChanged(_changed(dst, None, identity(dst))) from None


def _take_back(src: Path, dst: Path, replaced: Path | None, published: Identity | None) -> None:
    """Undo one publish: the file that was at ``dst`` goes back, this run's returns to ``src``."""
    if replaced == src:  # swapped: swap again
        rename_path(dst, src, "exchange")
    elif replaced is not None:  # a second name was kept: ours gets one too, for the kept results
        try:
            os.link(dst, src, follow_symlinks=False)
        except OSError:  # no hard links: ours moves back (the target is empty for that moment)
            rename_path(dst, src, "new")
        rename_path(replaced, dst, "replace")
    elif identity(dst) == published:  # nothing was there: take ours away, and only ours
        rename_path(dst, src, "new")


def publish_to(moves: Sequence[tuple[Path, Path]], *, mode: int | None = None) -> list[Path]:
    """Move each staged file (in a staging folder beside its target: one file system) to its target, in order (data
    first, reports last), each with ordinary permissions or ``mode`` (less the umask: 0o600 for a secret); returns
    the targets. A target that fails its claim at its move raises :class:`OutputChanged` (this run's files kept in
    ``NAME.unpublished-TOKEN``, named in the message); if any move fails, the targets already moved get their
    previous file back (or are removed where there was none). See docs/files.md."""
    done: list[tuple[Path, Path, Path | None, Identity | None]] = []
    try:
        for src, dst in moves:
            src, dst = Path(src), Path(dst)
            os.chmod(src, (0o666 if mode is None else mode) & ~current_umask())
            with writing_in(dst.parent):
                replaced = _publish_file(src, dst)
            done.append((src, dst, replaced, identity(dst)))
    except BaseException as err:
        for src, dst, replaced, published in reversed(done):
            with contextlib.suppress(OSError):
                _take_back(src, dst, replaced, published)
        if isinstance(err, OutputChanged):
            kept = _set_aside(Path(src).parent for src, _ in moves)
            raise OutputChanged(f"{err}: it was left as it is, and {_kept_text(kept)}") from None
        raise
    claimed_now(dst for _, dst, _, _ in done)
    return [dst for _, dst, _, _ in done]


def publish(staged: Sequence[Path], folder: str | os.PathLike) -> list[Path]:
    """Move staged files into ``folder`` under their own names, in order; see :func:`publish_to`."""
    return publish_to([(Path(src), Path(folder) / Path(src).name) for src in staged])


def _publish_one_folder(staged: Path, target: Path) -> Path | None:
    held = claim_of(target)
    now = identity(target)
    if now is None:
        try:
            rename_path(staged, target, "new")
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise OutputChanged(_changed(target, None, identity(target))) from None
            raise
        return None
    if held is None or held.seen is None:
        raise OutputChanged(_changed(target, None, now))
    try:
        exchanged = rename_path(staged, target, "exchange")
    except FileNotFoundError:  # removed since it was looked at: nothing to replace
        rename_path(staged, target, "new")
        return None
    if not exchanged:
        # no exchange here: move the old folder aside, compare it, put it back if it changed
        aside = staged.parent / f".previous-{target.name}"
        rename_path(target, aside, "new")
        if folder_tree(aside) != held.tree:
            rename_path(aside, target, "new")
            raise OutputChanged(_changed(target, held.seen, now, "folder"))
        rename_path(staged, target, "new")
        return aside
    if folder_tree(staged) == held.tree:  # ``staged`` now holds the folder that was at ``target``
        return staged
    rename_path(target, staged, "exchange")
    raise OutputChanged(_changed(target, held.seen, now, "folder"))


def publish_folders(moves: Sequence[tuple[Path, Path]]) -> list[Path | None]:
    """Move each folder built in a staging folder to its target, all or none; returns, for each, where the folder it
    replaced now lies (inside the staging folder, removed with it), or None. A target must still be as claimed
    (:func:`claim_folder`: absent, or every entry below it unchanged), else :class:`OutputChanged` and the folders
    already moved are put back; nothing of a refused set is kept (a Triton repository would take a kept folder for
    a model). See docs/files.md."""
    done: list[tuple[Path, Path, Path | None]] = []
    try:
        for staged, target in moves:
            staged, target = Path(staged), Path(target)
            with writing_in(target.parent):
                done.append((staged, target, _publish_one_folder(staged, target)))
    except BaseException as err:
        for staged, target, replaced in reversed(done):
            with contextlib.suppress(OSError):
                if replaced == staged:
                    rename_path(target, staged, "exchange")
                elif replaced is not None:
                    rename_path(target, staged, "new")
                    rename_path(replaced, target, "new")
                else:
                    rename_path(target, staged, "new")
        if isinstance(err, OutputChanged):
            raise OutputChanged(f"{err}: it was left as it is, and this run's folders were removed") from None
        raise
    claimed_now(target for _, target, _ in done)
    return [replaced for _, _, replaced in done]
