"""The plain way, without vit-fast: a PyTriton script a user would write to serve the same weights.

    python benchmarks/plain_pytriton.py WEIGHTS.safetensors CONFIG.json [--http-port 8000 --grpc-port 8001
                                        --metrics-port 8002] [--name default] [--max-batch 64]

The model is timm's ViT (``timm.models.vision_transformer.VisionTransformer``) where timm imports; else the same
architecture in plain PyTorch below (timm's layers and parameter names; attention through
``F.scaled_dot_product_attention``, as timm's ``fused_attn`` does). Defaults everywhere else, as a user would have
them: torch's own thread count, PyTriton's own security settings except the statistics API, which is opened here as
for `vit-fast serve` on loopback so that perf_analyzer can measure both. It is the benchmark's reference
(benchmarks/serve_perf.py), not part of vit-fast: it imports nothing of ours.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
from safetensors.torch import load_file
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.attn.qkv(self.norm1(x)).reshape(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.attn.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, D))
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x))))


class PlainViT(nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        d, grid = c["embed_dim"], c["img_size"] // c["patch_size"]
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(c["in_chans"], d, c["patch_size"], c["patch_size"])
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid + 1, d))
        hidden = int(d * c["mlp_ratio"])
        self.blocks = nn.Sequential(*[Block(d, c["num_heads"], hidden) for _ in range(c["depth"])])
        self.norm, self.head = nn.LayerNorm(d, eps=1e-6), nn.Linear(d, c["num_classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def build(config: dict) -> nn.Module:
    keys = ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes")
    try:
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(**{k: config[k] for k in keys})
    except ImportError:  # timm, or the torchvision it imports, is not installed here
        return PlainViT(config)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("weights")
    p.add_argument("config")
    p.add_argument("--name", default="default")
    p.add_argument("--max-batch", type=int, default=64)
    for what, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        p.add_argument(f"--{what}-port", type=int, default=port)
    args = p.parse_args()
    config = json.loads(open(args.config).read())
    config = config.get("config", config)
    model = build(config)
    model.load_state_dict(load_file(args.weights))
    model.eval()
    print(f"plain: {type(model).__module__}.{type(model).__name__}, {torch.get_num_threads()} torch threads")

    @batch
    def infer(images: np.ndarray) -> dict:
        with torch.inference_mode():
            return {"logits": model(torch.from_numpy(images)).numpy()}

    triton_config = TritonConfig(
        http_address="127.0.0.1", http_port=args.http_port, grpc_address="127.0.0.1", grpc_port=args.grpc_port,
        metrics_address="127.0.0.1", metrics_port=args.metrics_port,
    )  # fmt: skip
    open_stats = TritonSecurityConfig(restricted_endpoints=["model-repository", "trace", "logging"])
    size = config["img_size"]
    with Triton(config=triton_config, security_config=open_stats) as triton:
        triton.bind(
            model_name=args.name,
            infer_func=infer,
            inputs=[Tensor(name="images", dtype=np.float32, shape=(config["in_chans"], size, size))],
            outputs=[Tensor(name="logits", dtype=np.float32, shape=(config["num_classes"],))],
            config=ModelConfig(max_batch_size=args.max_batch, batcher=DynamicBatcher(preferred_batch_size=[8])),
        )
        print("ready", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
