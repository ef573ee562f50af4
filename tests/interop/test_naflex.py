"""timm's NaFlexVit at native resolution: images of different sizes packed and padded into one batch, patched in
place by apply_vit_fast and judged by the numerics rule against timm in float64 at valid tokens and logits; padding
poisoned with NaN must not reach them. Every ``naflexvit_*`` of timm patches or is refused by name. The mask reader
(``vit_fast.interop.naflex.key_padding_lengths``) takes key padding of a prefix and nothing else."""

from __future__ import annotations

import copy

import pytest
import torch

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")

import vit_fast  # noqa: E402
from vit_fast.interop.naflex import key_padding_lengths, pack_images  # noqa: E402
from vit_fast.interop.timm_blocks import BlockPlan  # noqa: E402

from ..fakes import assert_attention_launches, kernel_launches, naflex_batch, trained_like  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

TINY = dict(depth=1, embed_dim=32, num_heads=2)  # head dim 16: the attention kernel's smallest


@pytest.mark.parametrize("name", timm.list_models("naflexvit_*"))
def test_every_naflexvit_patches_in_place(name):
    model = timm.create_model(name, pretrained=False, **TINY)
    assert type(model).__name__ == "NaFlexVit"
    keys = list(model.state_dict())
    vit_fast.apply_vit_fast(model, backend="triton")
    assert type(model).__name__ == "NaFlexVit" and list(model.state_dict()) == keys
    pool = type(getattr(model, "attn_pool", None)).__name__ == "AttentionPoolLatent"
    assert vit_fast.remove_vit_fast(model) == len(model.blocks) + pool


REFUSED = {
    "rope": (dict(rope_type="axial"), "rotary position embeddings (RoPE, RotaryEmbeddingCat)"),
}


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_naflexvit_features_refused_by_name(feature):
    kwargs, expected = REFUSED[feature]
    model = timm.create_model("naflexvit_base_patch16_gap", pretrained=False, **TINY, **kwargs)
    with pytest.raises(ValueError, match="apply_vit_fast") as info:
        vit_fast.apply_vit_fast(model, backend="triton")
    assert expected in str(info.value)
    assert vit_fast.remove_vit_fast(model) == 0


#: image-size mixes (16 px patches): padded twice, and once with every image the same number of patches
MIXES = {
    "1+2 patches": [(16, 16), (32, 16)],
    "3+4+1 patches": [(16, 48), (32, 32), (16, 16)],
    "4+4 patches, no padding": [(32, 32), (16, 64)],
}
#: representative models: prefix tokens and pooling of each kind, the map head, a ParallelScalingBlock
MODELS = {
    "gap (4 registers, LayerScale, avg pool)": ("naflexvit_base_patch16_gap", {}),
    "map (attention-pool head, 1 register)": ("naflexvit_base_patch16_map", {}),
    "radio (class token + registers, token pool)": ("naflexvit_base_patch16_radio_v3", {}),
    "siglip (no prefix tokens, gelu_tanh, map)": ("naflexvit_base_patch16_siglip", {}),
    "ParallelScalingBlock": ("naflexvit_base_patch16_gap", {"block_fn": "ParallelScalingBlock"}),
    "EvaBlock (swiglu_mlp: GluMlp, SiLU)": ("naflexvit_base_patch16_gap", {"swiglu_mlp": True}),
    "EvaBlock (SwiGLU with its norm)": ("naflexvit_base_patch16_gap", {"swiglu_mlp": True, "scale_mlp_norm": True}),
}


def _model(key: str) -> torch.nn.Module:
    name, extra = MODELS[key]
    if extra.get("block_fn") == "ParallelScalingBlock":
        from timm.models.vision_transformer import ParallelScalingBlock

        extra = dict(extra, block_fn=ParallelScalingBlock)
    torch.manual_seed(0)
    return trained_like(timm.create_model(name, pretrained=False, num_classes=8, **dict(TINY, depth=2), **extra), 1)


def _run(model, batch, features: bool = False):
    with torch.no_grad():
        if features:
            return model.forward_features(**batch)["patches"]
        return model(batch["patches"], patch_coord=batch["patch_coord"], patch_valid=batch["patch_valid"])


def _valid_tokens(model, tokens: torch.Tensor, patch_valid: torch.Tensor) -> torch.Tensor:
    """The rows of ``tokens [B, T, D]`` that are prefix tokens or valid patches, as ``[N, D]``."""
    prefix = patch_valid.new_ones(patch_valid.shape[0], model.num_prefix_tokens)
    return tokens[torch.cat([prefix, patch_valid], dim=1)]


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("key", sorted(MODELS))
@pytest.mark.parametrize("backend", ["triton", "auto"])
def test_naflexvit_matches_timm_at_native_resolution(key, mix, backend, monkeypatch):
    """backend "triton": kernels in the interpreter (the attention kernel where no sample is padded, PyTorch's
    masked attention otherwise, the other kernels always); then again with the padding poisoned with NaN, which
    must not reach a valid token (timm's avg pooling multiplies padding rows by 0, so NaN there reaches the logits
    through timm's own code: logits are judged on the clean batch). backend "auto" on a CPU: timm's own forwards,
    no launch."""
    model = _model(key)
    batch = naflex_batch(MIXES[mix], 16, seed=2)
    valid = batch["patch_valid"]
    padded = not bool(valid.all())
    eager, eager_tokens = _run(model, batch), _valid_tokens(model, _run(model, batch, features=True), valid)
    reference = copy.deepcopy(model).double()
    batch64 = dict(batch, patches=batch["patches"].double())
    expected = _run(reference, batch64)
    expected_tokens = _valid_tokens(model, _run(reference, batch64, features=True), valid)
    vit_fast.apply_vit_fast(model, backend=backend)
    (ours, tokens), launches = kernel_launches(
        lambda: (_run(model, batch), _valid_tokens(model, _run(model, batch, features=True), valid))
    )
    assert_within_eager(ours, eager, expected, name=f"{key} logits")
    assert_within_eager(tokens, eager_tokens, expected_tokens, name=f"{key} valid tokens")
    if backend == "auto":
        assert not launches
        return
    assert launches["_linear_kernel"]  # every block ran on the kernels
    # two forwards through the blocks; the head in the logits' one
    assert_attention_launches(launches, 2 * len(model.blocks), pool=int(model.attn_pool is not None), padded=padded)
    if padded:
        poisoned = dict(batch, patches=batch["patches"].masked_fill(~valid[..., None], float("nan")))
        tokens = _valid_tokens(model, _run(model, poisoned, features=True), valid)
        assert_within_eager(tokens, eager_tokens, expected_tokens, name=f"{key} valid tokens, NaN padding")


def test_a_mask_other_than_key_padding_runs_timm_blocks(monkeypatch):
    """Padding inside a row (not a prefix) or a float bias: timm's own block forward, the same numbers."""
    model = _model("gap (4 registers, LayerScale, avg pool)")
    batch = naflex_batch(MIXES["3+4+1 patches"], 16, seed=3)
    batch["patch_valid"][1, 1] = False  # a hole in the second image
    eager = _run(model, batch)
    vit_fast.apply_vit_fast(model, backend="triton")
    runs: list[int] = []
    original = BlockPlan.run
    monkeypatch.setattr(BlockPlan, "run", lambda plan, *args: runs.append(1) or original(plan, *args))
    assert torch.equal(_run(model, batch), eager)
    assert runs == []
    tokens = torch.randn(2, 5, 32)
    bias = torch.randn(2, 1, 5, 5)
    with torch.no_grad():
        assert torch.equal(model.blocks[0](tokens, attn_mask=bias), model.blocks[0].__dict__[_ORIGINAL](tokens, bias))
    assert runs == []


_ORIGINAL = "_vit_fast_original_forward"


def _prefix(lengths: list[int], tokens: int) -> torch.Tensor:
    return torch.arange(tokens) < torch.tensor(lengths)[:, None]


def test_key_padding_lengths_reads_prefix_masks_only():
    valid = _prefix([3, 5, 1], 5)  # [B, T]
    symmetric = (valid[:, :, None] & valid[:, None, :])[:, None]  # timm's NaFlex mask, as booleans
    additive = torch.zeros(symmetric.shape).masked_fill(~symmetric, torch.finfo(torch.float32).min)
    key_only = valid[:, None, None, :]
    expected = torch.tensor([3, 5, 1], dtype=torch.int32)
    for mask in (valid, valid.long(), symmetric, additive, key_only, key_only.expand(3, 1, 5, 5)):
        assert torch.equal(key_padding_lengths(mask, 3, 5), expected), mask.dtype
    assert key_padding_lengths(additive.masked_fill(~symmetric, float("-inf")), 3, 5) is not None
    hole = valid.clone()
    hole[1, 2] = False
    refused = [
        hole,  # padding inside a row
        _prefix([3, 0, 1], 5),  # a sample with no token
        additive + 0.5 * (additive == 0),  # a bias, not a mask
        valid.long() * 2,  # not 0/1
        ~key_only * -1e30,  # masked by a finite value above the dtype's lowest / 2: a bias as far as it is read
        valid[:, None, :].expand(3, 5, 5),  # 3-d
        symmetric.expand(3, 2, 5, 5),  # per head
        torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(3, 1, 5, 5),  # causal
    ]
    for mask in refused:
        assert key_padding_lengths(mask, 3, 5) is None
    assert key_padding_lengths(valid, 3, 6) is None and key_padding_lengths(valid, 2, 5) is None  # other shapes
    in_place = valid.clone()
    assert key_padding_lengths(in_place, 3, 5) is not None
    in_place[1, 1] = False  # the same tensor, changed: read again
    assert key_padding_lengths(in_place, 3, 5) is None
    with torch.inference_mode():  # an inference tensor has no version counter: read at every call
        made_in_inference = valid.clone()
        assert torch.equal(key_padding_lengths(made_in_inference, 3, 5), expected)
        made_in_inference[1, 1] = False
        assert key_padding_lengths(made_in_inference, 3, 5) is None
    assert key_padding_lengths(made_in_inference, 3, 5) is None  # and outside inference mode


def test_pack_images_pads_each_image_at_the_end():
    images = [torch.randn(3, 16, 48, dtype=torch.float64), torch.randn(3, 20, 16, dtype=torch.float64)]  # 3, 2 patches
    batch = pack_images(images, 16)
    assert batch["patches"].shape == (2, 3, 16 * 16 * 3) and batch["patches"].dtype == torch.float64
    assert batch["patch_valid"].tolist() == [[True, True, True], [True, True, False]]
    assert batch["patch_coord"][0].tolist() == [[0, 0], [0, 1], [0, 2]]
    assert batch["patch_coord"][1, 1].tolist() == [1, 0]  # the second image is 2 patches high (20 px, zero-padded)
    assert torch.equal(batch["patches"][0, 1], images[0][:, :, 16:32].permute(1, 2, 0).reshape(-1))  # P-P-C
    assert not batch["patches"][1, 2].any()  # padding is zeros


def test_differential_attention_with_key_padding_runs_timms_block(monkeypatch):
    """The differential-attention kernel takes no lengths: a padded batch keeps timm's own block forward."""
    model = timm.create_model("vit_dwee_patch16_reg1_gap_256", pretrained=False, img_size=32, depth=1, embed_dim=64)
    model = trained_like(model, 4)
    vit_fast.apply_vit_fast(model, backend="triton")
    runs: list[int] = []
    original = BlockPlan.run
    monkeypatch.setattr(BlockPlan, "run", lambda plan, *args: runs.append(1) or original(plan, *args))
    tokens = torch.randn(2, 5, 64)
    mask = _prefix([3, 5], 5)[:, None, None, :]
    block = model.blocks[0]
    with torch.no_grad():
        assert torch.equal(block(tokens, attn_mask=mask), block.__dict__[_ORIGINAL](tokens, attn_mask=mask))
    assert runs == []
