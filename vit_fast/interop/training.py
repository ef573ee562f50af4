"""Train the embedded default model: a small ViT on scikit-learn's handwritten digits.

    python -m vit_fast.interop.training --out vit_fast/assets
writes digits_vit.safetensors (fp32 weights, config in the metadata) and digits_vit.json (held-out accuracy, split
seed, command, epochs, versions, train time) into --out. How: docs/cli.md, "The embedded default model"."""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

from vit_fast.util.progress import Remaining

WEIGHTS_NAME = "digits_vit.safetensors"
INFO_NAME = "digits_vit.json"


def model_config(embed_dim: int = 64, depth: int = 4, num_heads: int = 2):
    from vit_fast.assets import IMG_SIZE
    from vit_fast.model.config import ViTConfig

    return ViTConfig(
        img_size=IMG_SIZE,
        patch_size=4,
        in_chans=1,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_ratio=4.0,
        qkv_bias=True,
        class_token=True,
        global_pool="token",
        num_classes=10,
    )


def random_shift(x: torch.Tensor, max_shift: int, fill: float, gen: torch.Generator) -> torch.Tensor:
    """Translate each image by whole pixels in [-max_shift, max_shift] (both axes), filling with ``fill``."""
    if max_shift <= 0:
        return x
    n, _, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4, value=fill)
    offsets = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=gen)
    out = torch.empty_like(x)
    for i in range(n):
        dy, dx = int(offsets[i, 0]), int(offsets[i, 1])
        out[i] = padded[i, :, dy : dy + h, dx : dx + w]
    return out


def sincos_pos_embed(dim: int, grid: tuple[int, int], prefix: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embedding ``[1, prefix + gh*gw, dim]`` (MAE-style; prefix rows 0)."""
    gh, gw = grid
    quarter = dim // 4
    omega = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter))
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    parts = []
    for coord in (ys.flatten(), xs.flatten()):
        angles = coord[:, None] * omega[None, :]
        parts += [torch.sin(angles), torch.cos(angles)]
    emb = torch.cat(parts, dim=1)
    emb = F.pad(emb, (0, dim - emb.shape[1]))
    emb = torch.cat([torch.zeros(prefix, dim, dtype=torch.float64), emb], dim=0)
    return emb[None].float()


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> float:
    """Top-1 accuracy in [0, 1]."""
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(x), batch):
        correct += int((model(x[i : i + batch]).argmax(-1) == y[i : i + batch]).sum())
    model.train(was_training)
    return correct / len(x)


def lr_at(step: int, total: int, warmup: int, base: float, final_frac: float = 0.01) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def train(args: argparse.Namespace) -> dict[str, Any]:
    from vit_fast import assets
    from vit_fast.interop.checkpoints import save_checkpoint
    from vit_fast.model.vit import VisionTransformer
    from vit_fast.util.files import claim, make_folders, write_atomic

    out = make_folders(args.out, "--out")
    claim(out / INFO_NAME)  # the record beside the weights, as it is before training: replaced only if unchanged
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(args.seed)

    data = assets.load_digits_split(seed=assets.SPLIT_SEED)
    x_train, y_train, x_test, y_test = data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    fill = float(assets.normalize(torch.zeros(())))  # the background (pixel 0) after normalisation

    cfg = model_config(args.embed_dim, args.depth, args.heads)
    model = VisionTransformer(cfg, backend="torch")
    model.init_weights(seed=args.seed)
    if args.pos_init == "sincos":  # a positional signal from step one: each 4x4 patch is ~one source pixel
        with torch.no_grad():
            model.pos_embed.copy_(sincos_pos_embed(cfg.embed_dim, cfg.grid_size, cfg.num_prefix_tokens))
    model.train()

    def decays(name: str, p: torch.Tensor) -> bool:  # weight matrices only: no biases, norms, tokens, pos_embed
        return p.ndim >= 2 and "pos_embed" not in name and "token" not in name

    decay = [p for n, p in model.named_parameters() if decays(n, p)]
    no_decay = [p for n, p in model.named_parameters() if not decays(n, p)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.999),
    )
    n = len(x_train)
    steps_per_epoch = math.ceil(n / args.batch_size)
    total = steps_per_epoch * args.epochs
    warmup = steps_per_epoch * args.warmup_epochs
    step = 0
    t0 = time.perf_counter()
    remaining = Remaining([1.0] * args.epochs)  # epochs alike: the first one measured says how long the rest take
    for epoch in range(args.epochs):
        perm = torch.randperm(n, generator=gen)
        running, seen = 0.0, 0
        for i in range(0, n, args.batch_size):
            idx = perm[i : i + args.batch_size]
            xb = random_shift(x_train[idx], args.shift, fill, gen)
            yb = y_train[idx]
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, warmup, args.lr)
            loss = F.cross_entropy(model(xb), yb, label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            running += float(loss.detach()) * len(idx)
            seen += len(idx)
            step += 1
        remaining.finished(epoch)
        left = remaining.text()  # the first epoch is always shown: it says how long the whole run will take
        if epoch == 0 or (epoch + 1) % args.log_every == 0 or epoch + 1 == args.epochs:
            elapsed = time.perf_counter() - t0
            msg = f"epoch {epoch + 1:3d}/{args.epochs}  loss {running / seen:.4f}  {elapsed:6.1f}s{left}"
            if args.log_test:
                msg += f"  (held-out {100 * evaluate(model, x_test, y_test):.2f}%, information only)"
            print(msg, file=sys.stderr, flush=True)
    train_time = time.perf_counter() - t0

    model.eval()
    test_acc = evaluate(model, x_test, y_test)
    train_acc = evaluate(model, x_train, y_train)
    print(
        f"held-out accuracy {100 * test_acc:.2f}% ({len(y_test)} images); train {100 * train_acc:.2f}%; "
        f"{train_time:.1f}s",
        file=sys.stderr,
    )

    extra = {"vit_fast_default": "digits", "heldout_accuracy": f"{test_acc:.6f}"}
    save_checkpoint(model, out / WEIGHTS_NAME, extra=extra)
    import sklearn

    n_params = sum(p.numel() for p in model.parameters())
    info: dict[str, Any] = {
        "name": "digits_vit",
        "description": "ViT trained on scikit-learn's handwritten digits (8x8, upsampled to 32x32), 10 classes",
        "weights": WEIGHTS_NAME,
        "dtype": "float32",
        "num_params": n_params,
        "config": cfg.to_dict(),
        "heldout_accuracy": round(test_acc, 6),
        "heldout_correct": int(round(test_acc * len(y_test))),
        "heldout_size": len(y_test),
        "train_accuracy": round(train_acc, 6),
        "train_size": len(y_train),
        "split": {
            "function": "sklearn.model_selection.train_test_split",
            "test_size": assets.TEST_SIZE,
            "stratify": "labels",
            "shuffle": True,
            "random_state": assets.SPLIT_SEED,
        },
        "preprocessing": {
            "pixels": "sklearn load_digits values 0..16, divided by 16",
            "resize": f"bilinear 8x8 -> {assets.IMG_SIZE}x{assets.IMG_SIZE}, align_corners=False",
            "mean": assets.DIGITS_MEAN,
            "std": assets.DIGITS_STD,
            "formula": "(x / 16 upsampled - mean) / std",
        },
        "training": {
            "seed": args.seed,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "optimizer": "AdamW",
            "lr": args.lr,
            "weight_decay": args.weight_decay,
            "schedule": f"linear warm-up {args.warmup_epochs} epochs, cosine to 1% of lr",
            "label_smoothing": args.label_smoothing,
            "grad_clip": 1.0,
            "pos_embed_init": args.pos_init,
            "augmentation": f"random shift of up to {args.shift} px (32x32 grid), background fill",
            "threads": args.threads,
            "deterministic": True,
        },
        "command": "python -m vit_fast.interop.training " + " ".join(shlex.quote(a) for a in args.argv),
        "train_time_s": round(train_time, 1),
        "torch": torch.__version__,
        "sklearn": sklearn.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_atomic(out / INFO_NAME, json.dumps(info, indent=2, sort_keys=False) + "\n")
    print(f"wrote {out / WEIGHTS_NAME} and {out / INFO_NAME}", file=sys.stderr)
    return info


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vit_fast.interop.training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="vit_fast/assets", help="folder for the weights and the JSON record")
    p.add_argument("--epochs", type=int, default=80)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--shift", type=int, default=2, help="max random shift in pixels (32x32 grid); 0 = none")
    p.add_argument("--embed-dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument(
        "--pos-init",
        choices=("sincos", "trunc_normal"),
        default="sincos",
        help="initial position embedding (learned either way)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (results are reproducible per count)")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--log-test", action="store_true", help="also print held-out accuracy while training (info only)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
