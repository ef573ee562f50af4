"""The one place our kernels touch Triton's private launch API (a compiled kernel's launcher, its handles and packed
metadata, the launch hook chains): one adapter per Triton version family, chosen once at import from
``triton.__version__``; an unknown version gets :class:`TritonLaunchVersionError`. Why, and how to add a family:
docs/kernels.md, section Resolved launches."""

from __future__ import annotations

from collections.abc import Callable

import triton
from triton import knobs

from vit_fast.base.versions import parse_version

#: a resolved launch: ``launch(stream, args, tail)`` runs the bound kernel on ``stream`` with the pointer and scalar
#: arguments ``args`` and the trailing constexprs ``tail``, as Triton's own launch would
Launch = Callable[[int, tuple, tuple], None]


class TritonLaunchVersionError(RuntimeError):
    """The installed triton is not one whose launch call vit-fast knows (the message names it and the fix)."""


class Triton36To39:
    """triton 3.6 to 3.9: ``CompiledKernel.run(grid_0, grid_1, grid_2, stream, function, packed_metadata,
    launch_metadata, enter_hook, exit_hook, *args)``, as ``JITFunction.run`` calls it in both (tests/kernels/
    test_triton_seam.py reads that call in the installed Triton's source)."""

    lowest, highest = (3, 6), (3, 9)

    @staticmethod
    def replayable(compiled) -> bool:
        """Whether ``compiled`` (what a launch through Triton returned) can be launched again through :meth:`bind`:
        not, e.g., an asynchronous compile still in flight."""
        return compiled is not None and hasattr(compiled, "packed_metadata")

    @staticmethod
    def bind(compiled, grid: tuple[int, int, int]) -> Launch:
        """The launch of ``compiled`` over ``grid``, its launcher, handles and packed metadata read once. It builds
        Triton's launch metadata and hands the launcher the hooks only while a hook is registered: Triton's own
        path builds it on every launch (its test is ``hook is None``, and a hook chain never is)."""
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata  # after the first launch
        metadata_of = compiled.launch_metadata
        g0, g1, g2 = grid
        hooks, chain = knobs.runtime, _HOOK_CHAIN

        def launch(stream: int, args: tuple, tail: tuple) -> None:
            enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
            # inline (no call per hook): a chain with a hook in it, or a plain callable set in the chain's place
            if (enter.calls if isinstance(enter, chain) else enter is not None) or (
                leave.calls if isinstance(leave, chain) else leave is not None
            ):
                metadata = metadata_of(grid, stream, *args, *tail)
                run(g0, g1, g2, stream, function, packed, metadata, enter, leave, *args, *tail)
            else:
                run(g0, g1, g2, stream, function, packed, None, None, None, *args, *tail)

        return launch


#: Triton's chain of launch hooks (``knobs.runtime.launch_enter_hook`` and ``launch_exit_hook`` are one each in
#: triton 3.6 and 3.9, never None; a profiler such as proton ``.add``s its hook to them)
_HOOK_CHAIN = getattr(knobs, "HookChain", ())

#: every family whose launch call we know, oldest first
FAMILIES = (Triton36To39,)


def seam_for(version: str) -> type[Triton36To39]:
    """The adapter for triton ``version`` (``"3.9.0"``, ``"3.6.0+git1234"``); :class:`TritonLaunchVersionError`
    naming it and the fix when no family knows it."""
    parsed = parse_version(version)
    for family in FAMILIES:
        if parsed is not None and family.lowest <= parsed[:2] <= family.highest:
            return family
    known = ", ".join(f"{'.'.join(map(str, f.lowest))} to {'.'.join(map(str, f.highest))}" for f in FAMILIES)
    raise TritonLaunchVersionError(
        f"vit-fast re-launches compiled kernels through Triton's launcher, whose call it knows for triton {known}; "
        f"triton {version} is installed. Install a torch that pins one of those (or pip install "
        f"'triton>=3.6,<3.10' on a CPU-only torch), or run the torch backend (backend='torch')"
    )


#: the adapter of the installed triton, or the error saying why there is none (raised where a compiled launch is
#: set up: :func:`installed_seam`; the interpreter launches through Triton's own path and needs none)
try:
    _INSTALLED: type[Triton36To39] | TritonLaunchVersionError = seam_for(triton.__version__)
except TritonLaunchVersionError as error:
    _INSTALLED = error


def installed_seam() -> type[Triton36To39]:
    """The adapter chosen at import for the installed triton; raises :class:`TritonLaunchVersionError` if none."""
    if isinstance(_INSTALLED, TritonLaunchVersionError):
        raise TritonLaunchVersionError(str(_INSTALLED))
    return _INSTALLED
