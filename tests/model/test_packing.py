"""A packed forward (images of different sizes in one call) against the ordinary forward of each image alone.

Judged by the project's rule: image i's packed output in float32 may be at most 2x as far from the ordinary
forward of image i alone in float64 as that ordinary forward in float32 is, plus a small floor; in float64 the
packed forward is the ordinary one to the float64 floor. On the triton backend the kernels run in Triton's
interpreter (tiny configs), and the attention kernel's cu_seqlens path is seen to launch once per block.
"""

from __future__ import annotations

import copy

import pytest
import torch

from vit_fast.model import packing

from ..fakes import TINY, assert_attention_launches, kernel_launches, tiny_model
from ..numerics import (
    assert_within_eager,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
)

# three mixes of sizes (pixels, 8-px patches): square and not, odd grids (5x3, 7x1, 3x3), one size repeated,
# the native 32x32 among others, a lone image
MIXES = {
    "square-wide-tiny": [(32, 32), (24, 40), (8, 8)],
    "odd-grids-repeated": [(40, 24), (16, 48), (40, 24), (56, 8), (24, 24)],
    "one-image": [(24, 40)],
}
# name -> ViTConfig overrides (dynamic_img_size added): class-token pooling; registers, no class token, average
# pooling with fc_norm and LayerScale
CONFIGS = {
    "cls-reg1": dict(reg_tokens=1),
    "reg2-avg-layerscale": dict(
        class_token=False, reg_tokens=2, no_embed_class=True, global_pool="avg", init_values=0.3
    ),
}


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _model(config: str, **extra):
    return tiny_model(seed=sum(map(ord, config)), dynamic_img_size=True, **CONFIGS[config], **extra).to(_device())


def _images(sizes, seed: int = 0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=gen).to(_device(), dtype) for h, w in sizes]


def _alone(model, images):
    """Each image through the ordinary forward alone: logits [N, C] and a list of tokens [T_i, D]."""
    logits = torch.cat([model(image[None]) for image in images])
    return logits, [model.forward_features(image[None])[0] for image in images]


def _check_against_alone(model, images, eager_backend: str = "torch"):
    model64 = copy.deepcopy(model).double().set_backend("torch")
    with torch.no_grad():
        ref_logits, ref_feats = _alone(model64, [image.double() for image in images])
        backend = model.backend
        eager_logits, eager_feats = _alone(model.set_backend(eager_backend), images)
        model.set_backend(backend)
        logits = model.forward_packed(images)
        feats = model.forward_features_packed(images)
    assert logits.shape == (len(images), model.cfg.num_classes)
    assert [tuple(f.shape) for f in feats] == [tuple(f.shape) for f in ref_feats]
    assert_within_eager(logits, eager_logits, ref_logits, "packed logits")
    for i, (ours, eager, ref) in enumerate(zip(feats, eager_feats, ref_feats, strict=True)):
        assert_within_eager(ours, eager, ref, f"packed tokens of image {i}")


@pytest.mark.parametrize("mix", list(MIXES), ids=str)
@pytest.mark.parametrize("config", list(CONFIGS), ids=str)
def test_torch_packed_matches_each_image_alone(config, mix):
    _check_against_alone(_model(config), _images(MIXES[mix]))


@pytest.mark.parametrize("config", list(CONFIGS), ids=str)
def test_torch_packed_in_float64_is_the_ordinary_forward(config):
    """In float64 nothing but summation order separates the two: the packed forward is each image's forward."""
    model = _model(config).double()
    images = _images(MIXES["odd-grids-repeated"], dtype=torch.float64)
    with torch.no_grad():
        ref_logits, ref_feats = _alone(model, images)
        logits = model.forward_packed(images)
        feats = model.forward_features_packed(images)
    assert_within_eager(logits, ref_logits, ref_logits, "float64 packed logits")
    for i, (ours, ref) in enumerate(zip(feats, ref_feats, strict=True)):
        assert_within_eager(ours, ref, ref, f"float64 packed tokens of image {i}")


@pytest.mark.parametrize("mix", list(MIXES), ids=str)
@pytest.mark.parametrize("config", list(CONFIGS), ids=str)
def test_triton_packed_matches_each_image_alone_and_launches_packed_attention(config, mix):
    model = _model(config).set_backend("triton")
    images = _images(MIXES[mix], seed=1)
    _check_against_alone(model, images)
    with torch.no_grad():
        _, launches = kernel_launches(lambda: model(images))
    # one attention launch per block for the whole pack, one patch embedding per distinct size
    assert_attention_launches(launches, model.cfg.depth, padded=False)
    assert launches["_patch_embed_kernel"] == len(set(MIXES[mix]))


def test_triton_packed_attention_gets_the_images_offsets(monkeypatch):
    """What reaches the kernel: cu_seqlens of each image's tokens in packed order (grouped by size), the longest as
    max_seqlen; the images' own order comes back out."""
    from vit_fast.backend import triton_path

    model = _model("cls-reg1").set_backend("triton")
    sizes = [(24, 40), (8, 16), (24, 40)]  # 1 + 1 prefix + 15, 2, 15 patches
    seen = []
    real = triton_path._Ops.attend

    def spy(self, qkv, num_heads, scale, masks):
        seen.append((tuple(qkv.shape[:2]), masks.cu_seqlens.tolist(), masks.max_seqlen, masks.lengths))
        return real(self, qkv, num_heads, scale, masks)

    monkeypatch.setattr(triton_path._Ops, "attend", spy)
    with torch.no_grad():
        feats = model.forward_features_packed(_images(sizes))
    assert seen == [((1, 17 + 17 + 4), [0, 17, 34, 38], 17, None)] * model.cfg.depth
    assert [f.shape[0] for f in feats] == [17, 4, 17]


@pytest.fixture
def first_use_net(monkeypatch):
    """The first-use safety net on (under the interpreter it is off by default), fresh before and after."""
    from vit_fast.backend import first_use

    monkeypatch.setenv(first_use.ENV, "1")
    first_use.reset()
    yield first_use
    first_use.reset()


def test_first_use_net_judges_the_packed_attention(first_use_net, monkeypatch):
    """The packed forward's attention is judged with its cu_seqlens (a shape class of its own), even after an
    ordinary forward of its first image cleared that one; then the packed forward is cleared too."""
    from vit_fast.backend import triton_path

    judged, real = [], first_use_net.check
    monkeypatch.setattr(first_use_net, "check", lambda key, *a, **k: judged.append(key) or real(key, *a, **k))
    model = _model("cls-reg1").set_backend("triton")
    images = _images([(24, 40), (8, 16)])
    with torch.no_grad():
        model(images[0][None])
        ordinary = len(judged)
        model(images)
    packed = [key for key in judged[ordinary:] if key[0] == "attention"]
    assert len(packed) == 1 and packed[0][-1][-2:] == (False, True), judged[ordinary:]
    assert all(finding["passed"] for finding in first_use_net.report()["checked"])
    key = ("packed", *(tuple(image.shape) for image in images))
    with torch.no_grad():
        assert triton_path.ops_for(model, images[0], key) is triton_path._FORWARD[True]  # cleared, launching directly


def test_a_wrong_packed_attention_falls_back_to_eager(first_use_net, monkeypatch):
    """The attention kernel is wrong (output + 0.5) on packed input only: the net catches it, warns, and the packed
    forward still gives each image's answer (the eager reference honours cu_seqlens)."""
    from vit_fast.kernels import attention as attention_module

    real = attention_module.launch_attention

    def wrong(*args, cu_seqlens=None, **kwargs):
        out = real(*args, cu_seqlens=cu_seqlens, **kwargs)
        return out if cu_seqlens is None else out + 0.5

    monkeypatch.setattr(attention_module, "launch_attention", wrong)  # what the attention op launches
    model = _model("reg2-avg-layerscale").set_backend("triton")
    images = _images(MIXES["square-wide-tiny"], seed=4)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="'attention' runs in eager PyTorch"):
        logits = model.forward_packed(images)
    model64 = copy.deepcopy(model).double().set_backend("torch")
    with torch.no_grad():
        ref, _ = _alone(model64, [image.double() for image in images])
        eager, _ = _alone(model.set_backend("torch"), images)
    assert_within_eager(logits, eager, ref, "packed logits after the fallback")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_triton_packed_half(dtype):
    """bfloat16 is valid under the interpreter only because every kernel upcasts its dot operands to fp32 there."""
    model = _model("reg2-avg-layerscale")
    images = _images(MIXES["square-wide-tiny"], seed=2)
    with torch.no_grad():
        ref_logits, _ = _alone(copy.deepcopy(model).double(), [image.double() for image in images])
    model, images = model.to(dtype), [image.to(dtype) for image in images]
    with torch.no_grad():
        eager_logits, _ = _alone(model, images)
        logits = model.set_backend("triton").forward_packed(images)
    assert logits.dtype == dtype
    assert_within_eager(logits, eager_logits, ref_logits, f"packed logits {dtype}")


def test_model_called_with_a_list_runs_packed_and_a_tensor_as_before(monkeypatch):
    model = _model("cls-reg1")
    images = _images(MIXES["square-wide-tiny"])
    with torch.no_grad():
        assert torch.equal(model(images), model.forward_packed(images))
        assert torch.equal(model(tuple(images)), model.forward_packed(images))
        x = torch.randn(2, 3, 24, 40, device=_device())
        expected = model(x)
        monkeypatch.setattr(packing, "packed_forward", lambda *a: pytest.fail("a tensor went to the packed path"))
        assert torch.equal(model(x), expected)


def test_pre_logits_and_headless_models_return_pooled_features():
    images = _images(MIXES["square-wide-tiny"])
    model = _model("reg2-avg-layerscale")
    headless = _model("reg2-avg-layerscale", num_classes=0)
    with torch.no_grad():
        pooled = model.forward_packed(images, pre_logits=True)
        assert pooled.shape == (3, TINY["embed_dim"])
        assert torch.allclose(model.head(pooled), model.forward_packed(images))
        assert headless(images).shape == (3, TINY["embed_dim"])


def test_uint8_images_normalised_inside_the_model():
    model = _model("cls-reg1").set_input_normalization((0.5, 0.4, 0.3), (0.2, 0.3, 0.25))
    gen = torch.Generator().manual_seed(3)
    images = [torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8) for h, w in [(16, 24), (32, 8)]]
    with torch.no_grad():
        logits = model.forward_packed(images)
        alone = torch.cat([model(image[None]) for image in images])
    torch.testing.assert_close(logits, alone, rtol=1e-5, atol=1e-5)


def test_layout_groups_images_by_size_and_keeps_their_order():
    model = _model("cls-reg1")
    images = _images([(24, 40), (8, 8), (24, 40), (16, 16)])
    layout = packing.layout_of(model, images, packing.check_images(model, images))
    assert layout.groups == (((0, 2), (3, 5)), ((1,), (1, 1)), ((3,), (2, 2)))
    assert layout.cu_seqlens == (0, 17, 34, 37, 43)
    assert layout.spans == ((0, 17), (34, 37), (17, 34), (37, 43))
    assert list(layout.runs()) == [(0, 2, 17), (34, 1, 3), (37, 1, 6)]
    assert (layout.total_tokens, layout.max_seqlen) == (43, 17)


# ----------------------------------------------------------------------------- errors, before any work
#: case -> (the images, the error's type, what its message says)
BAD = {
    "empty": (lambda: [], ValueError, r"empty list of images: pass at least one image \[C, H, W\]"),
    "a batch tensor": (
        lambda: torch.randn(2, 3, 16, 16),
        TypeError,
        r"takes a list of images \[C, H, W\].*got Tensor; a batch tensor \[B, C, H, W\] of one size goes to model\(x\)",
    ),
    "not a tensor": (
        lambda: [torch.randn(3, 16, 16), "img.png"],
        TypeError,
        r"expected a torch.Tensor image \[C, H, W\] as images\[1\], got str: pass a torch.Tensor image batch",
    ),
    "batch dim kept": (
        lambda: [torch.randn(1, 3, 16, 16)],
        ValueError,
        r"images\[0\] has shape \(1, 3, 16, 16\); each image must be \[C, H, W\]\. Drop its batch dimension",
    ),
    "wrong channels, HWC": (
        lambda: [torch.randn(3, 16, 16), torch.randn(16, 24, 3)],
        ValueError,
        r"images\[1\] has 16 channels .* takes 3\. It looks like channels-last \(HWC\): pass images\[1\]\.permute",
    ),
    "smaller than a patch": (
        lambda: [torch.randn(3, 16, 16), torch.randn(3, 4, 16)],
        ValueError,
        r"images\[1\] is 4x16, smaller than one 8x8 patch: resize it to at least 8x8",
    ),
    "not a multiple of the patch": (
        lambda: [torch.randn(3, 20, 16)],
        ValueError,
        r"images\[0\] \(20x16\): image size 20x16 is not divisible by the patch size 8; .* 16x16",
    ),
    "mixed dtype": (
        lambda: [torch.randn(3, 16, 16), torch.randn(3, 16, 16, dtype=torch.float64)],
        ValueError,
        r"images\[0\] is torch.float32 on cpu but images\[1\] is torch.float64 on cpu: one packed forward",
    ),
    "mixed device": (
        lambda: [torch.randn(3, 16, 16), torch.randn(3, 16, 16, device="meta")],
        ValueError,
        r"images\[1\] is torch.float32 on meta: one packed forward takes images of one dtype on one device",
    ),
    "weights' dtype": (
        lambda: [torch.randn(3, 16, 16, dtype=torch.float64)],
        ValueError,
        r"images\[0\] \(16x16\): input dtype torch.float64 differs from the weights' torch.float32",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=str)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bad_input_is_refused_before_any_work(case, backend, monkeypatch):
    make, error, pattern = BAD[case]
    model = tiny_model(dynamic_img_size=True).set_backend(backend)
    monkeypatch.setattr(packing, "layout_of", lambda *a: pytest.fail("work started before the input was checked"))
    with pytest.raises(error, match=pattern):
        model.forward_packed(make())
    with pytest.raises(error, match=pattern):
        model.forward_features_packed(make())


def test_a_fixed_size_model_takes_its_own_size_only():
    model = tiny_model()
    with torch.no_grad():
        assert model([torch.randn(3, 32, 32), torch.randn(3, 32, 32)]).shape == (2, TINY["num_classes"])
    with pytest.raises(ValueError, match=r"images\[1\] \(24x40\): expected 32x32 images .*dynamic_img_size=True"):
        model([torch.randn(3, 32, 32), torch.randn(3, 24, 40)])


@pytest.mark.parametrize("part", ["attn", "mlp"])
def test_a_block_part_it_would_take_apart_wrongly_is_refused(part, monkeypatch):
    """The packed forward runs a block part by part (its Attention's qkv / proj, its Mlp's fc1 / act / fc2): a
    replaced attention or MLP module, whose own forward would not be run, is refused by name before any work."""

    class Custom(torch.nn.Module):
        def forward(self, x):
            return x

    model = tiny_model(dynamic_img_size=True)
    setattr(model.blocks[0], part, Custom())
    monkeypatch.setattr(packing, "layout_of", lambda *a: pytest.fail("work started before the model was checked"))
    with pytest.raises(
        TypeError, match=r"runs vit_fast.model.layers.Block with its Attention and Mlp, got Block .*Custom"
    ):
        model.forward_packed([torch.randn(3, 16, 16)])
