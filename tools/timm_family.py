"""How many of timm's ViT family ``apply_vit_fast`` patches in place with parity.

Every name of the families (``vit_*``, ``deit*``, ``eva*``, ``naflexvit*``, ``aimv2*``, ``vit_pe_*``, ``*dinov3*``,
``*rope*``) in ``timm.list_models`` whose class is ``VisionTransformer``, ``VisionTransformerDistilled``, ``NaFlexVit``
or ``Eva`` (rotary embeddings in the attention kernel) is built with ``pretrained=False``, shrunk so the kernels run in
Triton's interpreter (depth 1, ``embed_dim`` 64 in 2 heads, a 3x3 patch grid; every other argument, so every
feature, is the model's own), given trained-like random weights (LayerScale gammas and norm scales signed and far
from their init), and patched with ``apply_vit_fast(model, backend="triton")``. A NaFlexVit takes a padded batch of
two images at their own sizes (3x3 and 2x3 patches: ``vit_fast.interop.naflex.pack_images``). A model counts when it
patches, every block ran on the kernels, and its float32 logits meet the numerics rule (at most 2x eager float32's
error against timm in float64, plus the floor). Other classes of those names (VisionTransformerRelPos) are
listed with the refusal they get. A table gives each family's counts (a name may be in two families).

    python tools/timm_family.py                    # all of them (about 15 minutes on 2 CPU cores)
    python tools/timm_family.py --filter siglip    # names containing 'siglip'
    python tools/timm_family.py --family 'eva*'    # one family (repeat the flag for more)
    python tools/timm_family.py --json out.json    # one row per model as well ({"rows": [...]})
    python tools/timm_family.py --shard 2/3        # every third name from the second (one of 3 processes)

Exit status 0 when at least ``--target`` percent (97) of the counted models pass, leaving out those refused for a
feature "not yet on the kernels" (SwiGLU MLPs, qk-norm or a norm inside an Eva attention), which the table lists.
On a CPU machine without torchvision it imports timm through the tests' torchvision stand-in
(tests/torchvision_standin.py).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("VisionTransformer", "VisionTransformerDistilled", "NaFlexVit", "Eva")
#: the families reported, as ``timm.list_models`` patterns
FAMILIES = ("vit_*", "deit*", "eva*", "naflexvit*", "aimv2*", "vit_pe_*", "*dinov3*", "*rope*")
#: a refusal that names a feature the kernels do not run yet (not counted against the target)
NOT_YET = "not yet on the kernels"


def _import_timm():
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import torchvision  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT))
        from tests.torchvision_standin import install

        install()
    import timm

    return timm


def _trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gamma = name.endswith((".gamma", ".gamma_1", ".gamma_2"))  # timm's LayerScale, Eva's gammas
            if gamma or (p.ndim == 1 and "norm" in name and name.endswith(".weight")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (0.0 if gamma else 1.0))
            else:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def _small(timm, name: str, full: torch.nn.Module):
    """The model shrunk (depth 1, 64 or 96 wide in heads of 32, a 3x3 grid), or depth 1 only where timm refuses."""
    embed = getattr(full, "patch_embed", None) or full.embeds  # NaFlexVit: embeds
    hybrid = type(embed).__name__ == "HybridEmbed"
    patch = embed.patch_size[0]
    img = 64 if hybrid else 3 * patch
    small = [dict(depth=1, embed_dim=w, num_heads=w // 32, img_size=img) for w in (64, 96)]
    if type(full).__name__ == "Eva" and getattr(full, "attn_pool", None) is not None:  # its pool's own head count
        small = [dict(kwargs, attn_pool_num_heads=kwargs["num_heads"]) for kwargs in small]
    for kwargs in (*small, dict(depth=1, img_size=img)):  # 96 wide: SwiGLU's hidden width must be even
        try:
            return timm.create_model(name, pretrained=False, **kwargs), kwargs, type(full).__name__
        except Exception:  # noqa: BLE001  (some builders fix the width: try the next reduction)
            continue
    return timm.create_model(name, pretrained=False, depth=1), dict(depth=1), type(full).__name__


def _inputs(model: torch.nn.Module):
    """Two images for ``model``: at its own size, or for a NaFlexVit 3x3 and 2x3 patches, packed and padded."""
    gen = torch.Generator().manual_seed(2)
    if type(model).__name__ != "NaFlexVit":
        return torch.randn(2, 3, *model.patch_embed.img_size, generator=gen)
    from vit_fast.interop.naflex import pack_images

    patch = model.embeds.patch_size[0]
    return pack_images([torch.randn(3, 3 * patch, h * patch, generator=gen) for h in (3, 2)], patch)


def _double(x):
    if isinstance(x, dict):  # a NaFlex batch: its patches in float64, coordinates and validity as they are
        return {k: v.double() if v.is_floating_point() else v for k, v in x.items()}
    return x.double()


def check(timm, name: str) -> dict:
    import vit_fast
    from vit_fast.interop.timm_blocks import BlockPlan
    from vit_fast.util.numerics import compare

    with torch.device("meta"):  # the class, and its refusal where it is not counted, without any weights
        full = timm.create_model(name, pretrained=False)
    cls = type(full).__name__
    if cls not in CLASSES:
        row = dict(name=name, cls=cls)
        try:
            vit_fast.apply_vit_fast(full, backend="triton")
            row.update(status="patched (not counted)")
        except (TypeError, ValueError) as err:
            row.update(status="refused", reason=str(err))
        return row
    torch.manual_seed(0)
    try:
        model, kwargs, _ = _small(timm, name, full)
    except Exception:  # noqa: BLE001  (timm builds it at full depth only, e.g. per-block kv heads: its refusal)
        try:
            vit_fast.apply_vit_fast(full, backend="triton")  # reads the blocks only: the meta model does
        except (TypeError, ValueError) as err:
            return dict(name=name, cls=cls, status="refused", reason=str(err))
        raise
    row = dict(name=name, cls=cls, kwargs=kwargs)
    model = _trained_like(model, seed=1)
    x = _inputs(model)
    with torch.no_grad():
        eager = model(x)
        ref64 = copy.deepcopy(model).double()(_double(x))
    try:
        vit_fast.apply_vit_fast(model, backend="triton")
    except (TypeError, ValueError) as err:
        row.update(status="refused", reason=str(err))
        return row
    runs = []
    original = BlockPlan.run
    BlockPlan.run = lambda plan, *args, **kwargs: runs.append(1) or original(plan, *args, **kwargs)
    try:
        with torch.no_grad():
            ours = model(x)
    finally:
        BlockPlan.run = original
    result = compare(ours, eager, ref64, torch.float32)
    blocks = len(model.blocks)
    ok = result["passed"] and len(runs) == blocks
    row.update(
        status="match" if ok else "mismatch",
        kernel_blocks=f"{len(runs)}/{blocks}",
        max_abs_err=result["max_abs_err"],
        eager_max_abs_err=result["eager_max_abs_err"],
        bound=result["bound"],
    )
    return row


def _family_table(rows: list[dict], families: dict[str, set[str]]) -> None:
    """One Markdown row per family: its models, those patched with parity, refused (for a feature not yet on the
    kernels / otherwise), and the rest (a mismatch or an error)."""
    print("\n| family | models | patched, match | refused: not yet | refused: other | mismatch / error |")
    print("|---|---|---|---|---|---|")
    for family, members in families.items():
        rs = [r for r in rows if r["name"] in members]
        if not rs:  # --filter left none of it
            continue
        match = sum(r["status"] == "match" for r in rs)
        yet = sum(r["status"] == "refused" and NOT_YET in r.get("reason", "") for r in rs)
        other = sum(r["status"] == "refused" for r in rs) - yet
        print(f"| `{family}` | {len(rs)} | {match} | {yet} | {other} | {len(rs) - match - yet - other} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", default="", help="only names containing this")
    parser.add_argument("--family", action="append", choices=FAMILIES, help="only this family (repeatable)")
    parser.add_argument("--json", help="also write one row per model to this JSON file")
    parser.add_argument("--after", default="", help="only names sorted after this one (resume a run)")
    parser.add_argument("--shard", default="1/1", help="K/N: every N-th name from the K-th")
    parser.add_argument("--target", type=float, default=97.0, help="percent that must match (default 97)")
    args = parser.parse_args(argv)
    from vit_fast.util.files import check_report_file, write_json_atomic

    json_path = None if args.json is None else check_report_file(args.json, "--json")  # before any model is built
    timm = _import_timm()
    families = {family: set(timm.list_models(family)) for family in args.family or FAMILIES}
    names = sorted(set().union(*families.values()))
    names = [n for n in names if args.filter in n and n > args.after]
    k, n = (int(v) for v in args.shard.split("/"))
    names = names[k - 1 :: n]
    rows, start = [], time.perf_counter()
    for name in names:
        try:
            row = check(timm, name)
        except Exception as err:  # noqa: BLE001  (a failure is a row of the count, not the end of it)
            row = dict(name=name, cls="?", status="error", reason=f"{type(err).__name__}: {err}")
        rows.append(row)
        extra = row.get("reason", "") or f"err {row.get('max_abs_err', 0):.2e} <= {row.get('bound', 0):.2e}"
        print(f"{row['status']:>10}  {row['cls']:<27} {name:<48} {extra[:160]}", flush=True)
    counted = [r for r in rows if r["cls"] in CLASSES]
    matched = sum(r["status"] == "match" for r in counted)
    not_yet = sum(r["status"] == "refused" and NOT_YET in r.get("reason", "") for r in counted)
    share = 100.0 * matched / max(1, len(counted) - not_yet)
    _family_table(rows, families)
    import timm as _timm

    print(
        f"\n{matched} of {len(counted)} timm {' / '.join(CLASSES)} models patch in place and match timm "
        f"({share:.1f} % of those not refused for a feature {NOT_YET!r}: {not_yet}; timm {_timm.__version__}, "
        f"torch {torch.__version__}); {len(rows) - len(counted)} other "
        f"models of these names: {sum(r['status'] == 'refused' for r in rows if r not in counted)} refused by name; "
        f"{time.perf_counter() - start:.0f} s"
    )
    if json_path is not None:
        write_json_atomic({"rows": rows}, json_path)  # an object: it carries the digest that proves it ours
    return 0 if share >= args.target else 1


if __name__ == "__main__":
    raise SystemExit(main())
