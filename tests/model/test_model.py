"""The torch-backend model: input checks, state dicts in timm names, checkpoints, image sizes."""

import pytest
import torch

import vit_fast
from vit_fast import VisionTransformer, ViTConfig
from vit_fast.interop.checkpoints import load_checkpoint, save_checkpoint

from ..fakes import TINY, tiny_model


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "shape, message",
    [
        ((3, 32, 32), r"expected a 4-D image batch \[B, C, H, W\], got a 3-D tensor.*x.unsqueeze\(0\)"),
        ((1, 1, 3, 32, 32), r"got a 5-D tensor of shape \(1, 1, 3, 32, 32\)"),
        ((2, 32, 32, 3), r"expected 3 channels.*channels-last \(NHWC\): pass x.permute\(0, 3, 1, 2\)"),
        ((2, 4, 32, 32), r"expected 3 channels.*RGBA: drop the alpha channel with x\[:, :3\]"),
        ((2, 32, 32, 4), r"channels-last RGBA"),
        ((2, 1, 32, 32), r"expected 3 channels in dim 1 of \[B, C, H, W\], got shape \(2, 1, 32, 32\)\.$"),
        ((2, 3, 40, 32), r"expected 32x32 images \(a 4x4 grid of 8-px patches\), got 40x32.*dynamic_img_size=True"),
        # a fixed-size model suggests its one size, never a nearest multiple it would refuse next
        (
            (2, 3, 33, 32),
            r"image size 33x32 is not divisible by the patch size 8, and this model takes 32x32 images "
            r"only: resize to 32x32$",
        ),
        ((0, 3, 32, 32), r"empty batch: got shape \(0, 3, 32, 32\)"),
    ],
)
def test_bad_input_shapes(shape, message):
    model = tiny_model()
    with pytest.raises(ValueError, match=message):
        model(torch.randn(shape))


def test_bad_dtype_and_device():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"input dtype torch.float16 differs from the weights' torch.float32"):
        model(torch.randn(1, 3, 32, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"input is on meta but the weights are on cpu"):
        model(torch.randn(1, 3, 32, 32, device="meta"))
    with pytest.raises(TypeError, match=r"expected a torch.Tensor"):
        model([[1.0]])
    # raw uint8 images: say how to convert and normalise, never "convert the model to uint8"
    with pytest.raises(
        ValueError, match=r"input dtype torch.uint8: .*x = \(\(x.float\(\) / 255 - mean\) / std\)"
    ) as info:
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    assert "model.to(torch.uint8)" not in str(info.value)


def test_dynamic_size_error_names_nearest_valid_size():
    model = tiny_model(dynamic_img_size=True)
    with pytest.raises(ValueError, match=r"nearest valid size is 40x24$"):
        model(torch.randn(1, 3, 39, 25))


def test_bad_backend():
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'torch', 'triton'\), got 'cuda'"):
        tiny_model().set_backend("cuda")


# ----------------------------------------------------------------------------- forward
@pytest.mark.parametrize(
    "overrides, tokens",
    [
        ({}, 17),
        (dict(reg_tokens=3), 20),
        (dict(reg_tokens=2, class_token=False, global_pool="avg", no_embed_class=True), 18),
        (dict(init_values=1e-2, pre_norm=True, act="gelu_tanh"), 17),
        (dict(num_classes=0), 17),
    ],
)
def test_forward_shapes(overrides, tokens):
    model = tiny_model(**overrides)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = model.forward_features(x)
        out = model(x)
    assert feats.shape == (2, tokens, TINY["embed_dim"])
    assert out.shape == (2, model.cfg.num_classes or TINY["embed_dim"])
    assert torch.isfinite(out).all()


def test_auto_backend_is_torch_on_cpu():
    model = tiny_model()
    assert model.resolved_backend(torch.randn(1, 3, 32, 32)) == "torch"


def test_dynamic_img_size_identical_at_native_size_and_runs_other_sizes():
    fixed = tiny_model()
    dynamic = tiny_model(dynamic_img_size=True)
    dynamic.load_state_dict(fixed.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(fixed(x), dynamic(x))
        for h, w in [(48, 32), (16, 40), (64, 64)]:
            feats = dynamic.forward_features(torch.randn(1, 3, h, w))
            assert feats.shape == (1, 1 + (h // 8) * (w // 8), TINY["embed_dim"])
            assert torch.isfinite(feats).all()


def test_avg_pool_uses_patch_tokens_only():
    model = tiny_model(reg_tokens=2, global_pool="avg")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        expected = model.head(model.fc_norm(tokens[:, 3:].mean(1)))
        torch.testing.assert_close(model(x), expected)


def test_training_mode_backward():
    model = tiny_model().train()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


# ----------------------------------------------------------------------------- timm names
def _timm_keys(depth, *, reg=False, cls=True, ls=False, pre_norm=False, fc_norm=False, head=True):
    keys = ["pos_embed", "patch_embed.proj.weight"]
    keys += ["cls_token"] if cls else []
    keys += ["reg_token"] if reg else []
    keys += [] if pre_norm else ["patch_embed.proj.bias"]
    keys += ["norm_pre.weight", "norm_pre.bias"] if pre_norm else []
    for i in range(depth):
        b = f"blocks.{i}."
        keys += [
            b + s
            for s in (
                "norm1.weight",
                "norm1.bias",
                "attn.qkv.weight",
                "attn.qkv.bias",
                "attn.proj.weight",
                "attn.proj.bias",
                "norm2.weight",
                "norm2.bias",
                "mlp.fc1.weight",
                "mlp.fc1.bias",
                "mlp.fc2.weight",
                "mlp.fc2.bias",
            )
        ]
        keys += [b + "ls1.gamma", b + "ls2.gamma"] if ls else []
    keys += ["fc_norm.weight", "fc_norm.bias"] if fc_norm else ["norm.weight", "norm.bias"]
    keys += ["head.weight", "head.bias"] if head else []
    return sorted(keys)


def test_timm_key_names_and_shapes_vit_base():
    with torch.device("meta"):
        model = VisionTransformer(ViTConfig.from_name("vit_base_patch16_224", depth=2))
    state = model.state_dict()
    assert sorted(state) == _timm_keys(2)
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes["cls_token"] == (1, 1, 768)
    assert shapes["pos_embed"] == (1, 197, 768)
    assert shapes["patch_embed.proj.weight"] == (768, 3, 16, 16)
    assert shapes["blocks.0.attn.qkv.weight"] == (2304, 768)
    assert shapes["blocks.1.mlp.fc1.weight"] == (3072, 768)
    assert shapes["blocks.1.mlp.fc2.weight"] == (768, 3072)
    assert shapes["head.weight"] == (1000, 768)


def test_timm_key_names_register_avg_layerscale_prenorm():
    with torch.device("meta"):
        reg = VisionTransformer(ViTConfig.from_name("vit_base_patch16_reg4_gap_256", depth=1))
        dino = VisionTransformer(ViTConfig.from_name("vit_small_patch14_reg4_dinov2", depth=1))
        clip = VisionTransformer(ViTConfig(depth=1, pre_norm=True, embed_dim=64, num_heads=2, img_size=32))
    assert sorted(reg.state_dict()) == _timm_keys(1, reg=True, cls=False, fc_norm=True)
    assert tuple(reg.state_dict()["pos_embed"].shape) == (1, 256, 768)  # no_embed_class: patches only
    assert sorted(dino.state_dict()) == _timm_keys(1, reg=True, ls=True, head=False)
    assert tuple(dino.state_dict()["reg_token"].shape) == (1, 4, 384)
    assert sorted(clip.state_dict()) == _timm_keys(1, pre_norm=True)


def test_state_dict_round_trip():
    a = tiny_model(seed=1, reg_tokens=2, init_values=0.1)
    b = tiny_model(seed=2, reg_tokens=2, init_values=0.1)
    x = torch.randn(2, 3, 32, 32)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


# ----------------------------------------------------------------------------- checkpoints
def test_safetensors_round_trip_carries_config(tmp_path):
    model = tiny_model(reg_tokens=1, global_pool="avg")
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
    loaded = load_checkpoint(path).eval()
    assert loaded.cfg == model.cfg
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert isinstance(vit_fast.load_model(str(path)), VisionTransformer)


def test_pth_loaded_with_weights_only(tmp_path):
    model = tiny_model()
    path = tmp_path / "m.pth"
    torch.save({"state_dict": model.state_dict(), "config": model.cfg.to_dict()}, path)
    loaded = load_checkpoint(path).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    plain = tmp_path / "plain.pth"
    torch.save(model.state_dict(), plain)
    with pytest.raises(ValueError, match=r"carries no vit-fast config .*Python: load_model\(\.\.\., config=\.\.\.\)"):
        load_checkpoint(plain)
    assert load_checkpoint(plain, cfg=model.cfg).cfg == model.cfg


def test_pth_with_code_is_refused(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {}, "payload": _Unsafe()}, path)
    with pytest.raises(ValueError, match=r"whose unpickling may run code") as info:
        load_checkpoint(path, cfg=ViTConfig(**TINY))
    assert "weights_only=False" not in str(info.value) and ".safetensors" in str(info.value)


class _Unsafe:
    pass


def test_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.safetensors"):
        load_checkpoint(tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"cannot read .*bad.safetensors.* as safetensors"):
        load_checkpoint(bad)
    other = tmp_path / "w.npz"
    other.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"unsupported checkpoint type '.npz'"):
        load_checkpoint(other)


def test_wrong_shapes_and_keys_are_named(tmp_path):
    model = tiny_model()
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match=r"blocks.0.attn.qkv.weight: \(144, 48\) in .*, \(192, 64\) expected"):
        load_checkpoint(path, cfg=ViTConfig(**{**TINY, "embed_dim": 64, "num_heads": 4}))
    with pytest.raises(ValueError, match=r"missing keys: \['reg_token'\]"):
        load_checkpoint(path, cfg=ViTConfig(**{**TINY, "reg_tokens": 1, "no_embed_class": True}))
    # a depth that differs from the blocks in the file is named before the model is built
    with pytest.raises(ValueError, match=r"says depth 1, but the weights from .* hold 2 blocks \(blocks.0 to blocks.1"):
        load_checkpoint(path, cfg=ViTConfig(**{**TINY, "depth": 1}))
    from safetensors.torch import save_file

    extra = {**{k: v.contiguous() for k, v in model.state_dict().items()}, "dist_token": torch.zeros(1, 1, 48)}
    save_file(extra, str(tmp_path / "extra.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected keys: \['dist_token'\]"):
        load_checkpoint(tmp_path / "extra.safetensors", cfg=ViTConfig(**TINY))


def test_pos_embed_resampled_for_another_image_size(tmp_path):
    """Weights made at 32 px load into a 48 px model; the grid part is resampled bicubically."""
    model = tiny_model()
    path = save_checkpoint(model, tmp_path / "m.safetensors")
    big = load_checkpoint(path, cfg=ViTConfig(**{**TINY, "img_size": 48})).eval()
    pe = big.pos_embed
    assert pe.shape == (1, 1 + 36, TINY["embed_dim"])
    assert torch.equal(pe[:, :1], model.pos_embed[:, :1])  # class-token row kept as is
    expected = vit_fast.backend.pos_embed.resample_pos_embed(model.pos_embed, (6, 6), (4, 4), 1)
    assert torch.equal(pe, expected)
    assert big(torch.randn(1, 3, 48, 48)).shape == (1, 7)


def test_load_model_by_preset_is_seeded():
    a = vit_fast.load_model("vit_tiny_patch16_224", backend="torch")
    b = vit_fast.load_model("vit_tiny_patch16_224", backend="torch")
    assert torch.equal(a.pos_embed, b.pos_embed) and a.pos_embed.abs().sum() > 0
    with pytest.raises(ValueError, match=r"cannot resolve model 'not_a_model'"):
        vit_fast.load_model("not_a_model")


def test_optimize_keeps_our_model_and_rejects_others():
    model = tiny_model()
    assert vit_fast.optimize(model) is model
    with pytest.raises(TypeError, match=r"optimize\(\) does not know torch.nn.modules.linear.Linear"):
        vit_fast.optimize(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("suffix", [".safetensors", ".pth", ".pt"])
def test_save_checkpoint_round_trips_every_suffix_it_accepts(tmp_path, suffix):
    model = tiny_model()
    path = save_checkpoint(model, tmp_path / f"w{suffix}", extra={"note": "hello"})
    again = load_checkpoint(path, backend="torch")
    assert again.cfg == model.cfg
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    from vit_fast.interop.checkpoints import read_state_dict

    assert read_state_dict(path)[1]["note"] == "hello"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"w{suffix}"]  # no temporary left


@pytest.mark.parametrize("name", ["w.bin", "w.ckpt", "w", "w.onnx"])
def test_save_checkpoint_refuses_other_suffixes_before_writing(tmp_path, name):
    with pytest.raises(ValueError, match=r"cannot tell the format .* name it w.safetensors \(preferred\) or w.pth"):
        save_checkpoint(tiny_model(), tmp_path / name)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- raw uint8 images
def test_uint8_images_normalised_inside_the_model():
    model = tiny_model()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    keys = list(model.state_dict())
    model.set_input_normalization(mean, std)
    assert list(model.state_dict()) == keys  # the statistics are not weights
    pixels = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    by_hand = (pixels.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(model(pixels), model(by_hand), rtol=0, atol=0)
        assert [n for n, _ in model.forward_stages(pixels)][0] == "patch embedding"
    with pytest.raises(ValueError, match=r"std must be > 0"):
        model.set_input_normalization(mean, (0.2, 0.0, 0.2))
    with pytest.raises(ValueError, match=r"mean must be 3 finite numbers"):
        model.set_input_normalization((0.5,), std)
    model.set_input_normalization(None, None)
    with pytest.raises(ValueError, match=r"or let the model do it: model.set_input_normalization"):
        model(pixels)


def test_eager_attention_is_fused_and_export_traces_the_plain_math(monkeypatch):
    """The torch backend's eager attention is one F.scaled_dot_product_attention; torch.export and tracing (what
    the ONNX exporters run) keep matmul, softmax, matmul, the graph artifacts are verified with. Same numbers."""
    import torch.nn.functional as F

    model = tiny_model(global_pool="avg").double().eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    with torch.no_grad():
        eager = model(x)
        assert len(calls) == model.cfg.depth
        calls.clear()
        traced = torch.jit.trace(model, x, check_trace=False)
        assert calls == [] and "softmax" in str(traced.inlined_graph)
        graph = torch.export.export(model, (x,)).graph_module.code
        assert calls == [] and "softmax" in graph and "scaled_dot_product" not in graph
        torch.testing.assert_close(traced(x), eager, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(reg_tokens=2, init_values=0.1),
        dict(pre_norm=True, fc_norm=True, qkv_bias=False),
        dict(reg_tokens=1, no_embed_class=True, dynamic_img_size=True),
    ],
)
def test_forward_runs_the_last_block_for_the_class_token_alone_with_the_same_numbers(overrides, monkeypatch):
    """Class-token pooling reads token 0 only, so forward() runs the last block for it alone: the same logits and
    gradients as the whole forward_features, in float64."""
    import vit_fast.model.stages as model_module  # where the forward's plan runs the blocks

    model = tiny_model(**overrides).double()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    runs = []
    functional = model_module.block_functional

    def record(block, t, first_token=False):
        runs.append((t.shape[1], first_token))
        return functional(block, t, first_token=first_token)

    monkeypatch.setattr(model_module, "block_functional", record)
    with torch.no_grad():
        whole = model.forward_head(model.forward_features(x))
        assert [first for _, first in runs] == [False] * model.cfg.depth
        runs.clear()
        torch.testing.assert_close(model(x), whole, rtol=1e-12, atol=1e-12)
    assert runs[-1] == (model.cfg.num_tokens, True) and [first for _, first in runs[:-1]] == [False] * (len(runs) - 1)
    grads = []
    for run in (lambda: model(x), lambda: model.forward_head(model.forward_features(x))):
        model.zero_grad()
        run().square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(init_values=0.1, act="gelu_tanh"), dict(qkv_bias=False, act="quick_gelu"), dict(act="silu")],
    ids=["plain", "layerscale-gelutanh", "nobias-quickgelu", "silu"],
)
@pytest.mark.parametrize("first_token", [False, True])
def test_functional_blocks_compute_exactly_what_the_modules_do(overrides, first_token):
    """layers.block_functional runs the same ops in the same order as the module calls: bit for bit the same
    outputs and gradients, for every activation, with and without LayerScale and qkv bias."""
    from vit_fast.model.layers import block_functional, runs_functional

    model = tiny_model(**overrides)
    block = model.blocks[0]
    assert runs_functional(block)
    x = torch.randn(2, model.cfg.num_tokens, model.cfg.embed_dim, requires_grad=True)
    outs, grads = [], []
    for run in (block.forward_first_token if first_token else block, lambda t: block_functional(block, t, first_token)):
        block.zero_grad()
        x.grad = None
        out = run(x)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append([x.grad.clone(), *(p.grad.clone() for p in block.parameters())])
    assert outs[0].shape[1] == (1 if first_token else model.cfg.num_tokens)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_replaced_layer_or_a_hook_keeps_the_module_calls():
    """A block whose parts are not exactly vit_fast's own (a LoRA-style Linear subclass) runs its modules, so the
    replacement's forward runs; so does every block when a hook anywhere in them could watch."""
    from vit_fast.model.layers import runs_functional

    class Lora(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            Lora.calls += 1
            return super().forward(x) + 0.5

    model = tiny_model(depth=2).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
        fc1 = model.blocks[0].mlp.fc1
        lora = Lora(fc1.in_features, fc1.out_features)
        lora.load_state_dict(fc1.state_dict())
        model.blocks[0].mlp.fc1 = lora
        assert not runs_functional(model.blocks[0]) and runs_functional(model.blocks[1])
        after = model(x)
    assert Lora.calls == 1 and not torch.equal(before, after)
    seen = []
    handle = model.blocks[1].mlp.fc2.register_forward_hook(lambda m, args, out: seen.append(out.shape[1]))
    with torch.no_grad():
        model.forward_features(x)
    handle.remove()
    assert seen == [model.cfg.num_tokens]


def test_forward_keeps_every_token_where_a_hook_or_an_exporter_watches(monkeypatch):
    """A hook anywhere in the last block (or a global one) sees the tokens it always saw; export traces it all."""
    from vit_fast.model.layers import Block

    model = tiny_model().double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    expected = model.forward_head(model.forward_features(x)).detach()
    monkeypatch.setattr(Block, "forward_first_token", lambda self, t: pytest.fail("the shortcut ran"))
    seen = []
    for module in (model.blocks[-1], model.blocks[-1].attn, model.blocks[-1].mlp.fc2):
        handle = module.register_forward_hook(lambda m, args, out: seen.append(out.shape[1]))
        torch.testing.assert_close(model(x), expected, rtol=1e-12, atol=1e-12)
        handle.remove()
    assert seen == [model.cfg.num_tokens] * 3
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, args: None)
    try:
        model(x)
    finally:
        handle.remove()
    torch.export.export(model, (x,))
    torch.jit.trace(model, x, check_trace=False)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("height", "width"), [(32, 32), (24, 40), (35, 29)])
def test_eager_patch_embedding_is_the_convolution_as_one_gemm(bias, height, width):
    """The eager patch embedding (patches gathered, one GEMM) against the strided convolution it replaces, in
    float64, on sizes that are not multiples of the patch (the convolution drops the partial last patch); an
    exporter and a hook on proj get the convolution itself."""
    from vit_fast.model.layers import PatchEmbed

    cfg = ViTConfig(**{**TINY, "pre_norm": not bias})
    embed = PatchEmbed(cfg).double()
    assert (embed.proj.bias is not None) == bias
    x = torch.randn(2, cfg.in_chans, height, width, dtype=torch.float64)
    conv = embed.proj(x).flatten(2).transpose(1, 2)
    torch.testing.assert_close(embed(x), conv, rtol=1e-12, atol=1e-12)
    seen = []
    handle = embed.proj.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    torch.testing.assert_close(embed(x), conv, rtol=0, atol=0)
    handle.remove()
    assert len(seen) == 1
