"""apply_vit_fast on timm's ViT family: every block kind, MLP and activation the kernels run, patched in place and
judged by the numerics rule against timm in float64 (kernels in Triton's interpreter); every refusal made at patch
time, by name, with nothing patched; torch.jit.script of a patched model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")

import vit_fast  # noqa: E402
from vit_fast.interop import timm_reading  # noqa: E402
from vit_fast.interop.timm_blocks import BlockPlan, PoolPlan  # noqa: E402
from vit_fast.kernels.launches import record_launches  # noqa: E402

from ..fakes import (  # noqa: E402
    Inputs,
    as_float64,
    assert_attention_launches,
    count_calls,
    eager_and_float64,
    export_on_the_kernels,
    kernel_launches,
    naflex_batch,
    requiring_grad,
    trained_like,
)
from ..numerics import assert_within_eager  # noqa: E402

SMALL = dict(depth=2, embed_dim=64, num_heads=2)
# feature -> (timm name, create_model overrides): one small model per feature apply_vit_fast runs
FEATURES = {
    "quick_gelu (OpenAI CLIP)": ("vit_base_patch32_clip_quickgelu_224", dict(SMALL, img_size=64)),
    "GELUTanh + map head (SigLIP)": ("vit_base_patch32_siglip_256", dict(SMALL, img_size=64)),
    "SwiGLU GluMlp, SiLU (DINOv2 giant)": (
        "vit_giant_patch14_dinov2",
        dict(depth=2, embed_dim=96, num_heads=3, img_size=42),
    ),
    "SwiGLU, RmsNorm, no biases (AIMv2)": ("aimv2_large_patch14_224", dict(SMALL, img_size=28)),
    "SwiGLU with its LayerNorm (scale_mlp_norm)": (
        "vit_tiny_patch16_224",
        dict(SMALL, img_size=32, mlp_layer=timm.layers.SwiGLU, scale_mlp_norm=True),
    ),
    "GluMlp with its LayerNorm (scale_mlp_norm)": (
        "vit_giant_patch14_dinov2",
        dict(depth=2, embed_dim=96, num_heads=3, img_size=28, scale_mlp_norm=True),
    ),
    "final_norm=False": ("vit_base_patch16_radio_v3", dict(SMALL, img_size=48)),
    "ParallelThingsBlock": ("vit_small_patch16_18x2_224", dict(SMALL, img_size=48)),
    "ResPostBlock": ("vit_base_patch16_rpn_224", dict(SMALL, img_size=48)),
    "distillation head": ("deit_tiny_distilled_patch16_224", dict(SMALL, img_size=48)),
    "hybrid embed": ("vit_tiny_r_s16_p8_224", dict(SMALL, img_size=64)),
    "no prefix tokens": ("vit_base_patch16_siglip_gap_224", dict(SMALL, img_size=48)),
    "act_layer=silu": ("vit_tiny_patch16_224", dict(SMALL, img_size=32, act_layer="silu")),
    "LayerScale + registers": ("vit_small_patch14_reg4_dinov2", dict(SMALL, img_size=28)),
    "DiffAttention (differential)": ("vit_dwee_patch16_reg1_gap_256", dict(SMALL, img_size=48)),
    # timm's own test models: test_vit4's Block, final norm and fc_norm are RmsNorm
    "test_vit: dynamic_img_size": ("test_vit", dict(depth=2, img_size=32)),
    "test_vit2: registers, avg pool, fc_norm": ("test_vit2", dict(depth=2, img_size=32)),
    "test_vit3: map head over the prefix tokens": ("test_vit3", dict(depth=2, img_size=32)),
    "test_vit4: RmsNorm Block": ("test_vit4", dict(depth=2, img_size=32)),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_timm_feature_patched_in_place(feature, monkeypatch):
    name, kwargs = FEATURES[feature]
    torch.manual_seed(0)
    model = trained_like(timm.create_model(name, pretrained=False, **kwargs), seed=1)
    x = torch.randn(2, 3, *model.patch_embed.img_size)
    keys, cls = list(model.state_dict()), type(model)
    eager, expected = eager_and_float64(model, x)
    vit_fast.apply_vit_fast(model, backend="triton")
    assert type(model) is cls and list(model.state_dict()) == keys
    runs = count_calls(monkeypatch, BlockPlan)
    with torch.no_grad():
        ours = model(x)
    assert len(runs) == len(model.blocks)  # every block ran on the kernels, none fell back to timm's forward
    assert_within_eager(ours, eager, expected, name=f"{name} patched")
    map_head = type(getattr(model, "attn_pool", None)).__name__ == "AttentionPoolLatent"  # patched too
    assert vit_fast.remove_vit_fast(model) == len(model.blocks) + map_head
    with torch.no_grad():
        assert torch.equal(model(x), eager)


def test_glu_mlp_gates_in_the_gemm_epilogue():
    """A GluMlp block (SwiGLU, DINOv2 giant) is the plain block's 5 launches: fc1 writes ``silu(x1) * x2`` from its
    stacked weight in one GEMM, with no eager chunk and gate between fc1 and fc2."""
    name, kwargs = FEATURES["SwiGLU GluMlp, SiLU (DINOv2 giant)"]
    torch.manual_seed(0)
    model = trained_like(timm.create_model(name, pretrained=False, **kwargs), seed=1)
    x = torch.randn(1, 3, *model.patch_embed.img_size)
    eager, expected = eager_and_float64(model, x)
    vit_fast.apply_vit_fast(model, backend="triton")
    with torch.no_grad(), record_launches() as launches:
        ours = model(x)
    gemms = [launch["config"]["GATE"] for launch in launches if launch["kernel"] == "_linear_kernel"]
    assert len(gemms) == 4 * len(model.blocks) and gemms.count(1) == len(model.blocks)  # fc1 gated, once per block
    assert sum(launch["kernel"] == "_attention_kernel" for launch in launches) == len(model.blocks)
    assert_within_eager(ours, eager, expected, name=f"{name} gated")


def test_patched_model_steps_aside_for_masks_and_float64(monkeypatch):
    """An attention mask or a float64 input runs timm's own block forward (the kernels take neither)."""
    model = trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, **SMALL), 2)
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, BlockPlan)
    tokens = torch.randn(2, 5, 64)
    mask = torch.zeros(5, 5, dtype=torch.bool).fill_diagonal_(True)
    with torch.no_grad():
        masked = model.blocks[0](tokens, attn_mask=mask)
        expected = model.blocks[0].__dict__["_vit_fast_original_forward"](tokens, attn_mask=mask)
        model.double()(torch.randn(1, 3, 32, 32, dtype=torch.float64))
    assert runs == [] and torch.equal(masked, expected)


# refused at patch time, by name; nothing is patched
REFUSED = {
    "RelPos": ("vit_relpos_small_patch16_224", dict(img_size=32, depth=1), "relative position bias"),
    "RelPos (test_vit_relpos)": ("test_vit_relpos", dict(img_size=32, depth=1), "relative position bias"),
    "Beit": ("beit_base_patch16_224", dict(img_size=32, depth=1, embed_dim=32, num_heads=2), "relative position bias"),
    "SAM": ("samvit_base_patch16", dict(img_size=64, depth=1, embed_dim=32, num_heads=2), "windowed attention"),
    **{
        f"{family} tower {kind}": (f"{name}{suffix}", dict(depth=1, **size), f"timm {family}Vit{kind} uses {why}")
        for family, name, size, why in (
            ("Gemma4", "gemma4_vit_167m", dict(embed_dim=32, num_heads=2, head_dim=16, intermediate_size=64), "2D rot"),
            ("Qwen3", "qwen3_vit_88m", dict(embed_dim=32, num_heads=2), "rotary position embeddings"),
            ("Deepseek", "deepseek_vit_412m", dict(embed_dim=32, num_heads=2), "rotary position embeddings"),
        )
        for kind, suffix in (("Encoder", "_enc"), ("Classifier", ""))
    },
    "qk_norm": ("vit_tiny_patch16_224", dict(img_size=32, depth=2, qk_norm=True), "blocks.0.attn.q_norm (qk-norm)"),
    "DiffAttention qk_norm": (
        "vit_dwee_patch16_reg1_gap_256",
        dict(img_size=32, depth=2, qk_norm=True),
        "blocks.0.attn.q_norm (qk-norm in differential attention)",
    ),
}


@pytest.mark.parametrize("feature", sorted(REFUSED))
def test_unsupported_timm_features_are_refused_by_name(feature):
    name, kwargs, expected = REFUSED[feature]
    model = timm.create_model(name, pretrained=False, **kwargs)
    with pytest.raises(ValueError, match="apply_vit_fast") as info:
        vit_fast.apply_vit_fast(model, backend="triton")
    assert expected in str(info.value)
    assert "blocks.1." not in str(info.value)  # each feature named once, not once per block
    assert vit_fast.remove_vit_fast(model) == 0  # nothing was patched


@pytest.mark.parametrize("name", timm.list_models("test_vit*"))
def test_timms_own_test_vits_are_patched_or_refused_by_name(name):
    """timm's own test ViTs (timm's test suite builds them): each is a patched row of FEATURES or a refusal row."""
    patched = {model for model, _ in FEATURES.values()}
    refused = {model for model, _, _ in REFUSED.values()}
    assert name in patched | refused, f"{name}: neither a FEATURES row (patched) nor a REFUSED row"


def test_triton_backend_refuses_small_head_dims_at_patch_time():
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, embed_dim=24)
    with pytest.raises(ValueError, match=r"head dims 16\.\.\d+, this model's is 8"):
        vit_fast.apply_vit_fast(model, backend="triton")
    assert vit_fast.remove_vit_fast(model) == 0
    vit_fast.apply_vit_fast(model, backend="auto")  # auto keeps timm's attention where ours cannot run
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_torchscript_of_a_patched_model():
    """torch.jit.script compiles the model as timm wrote it (TorchScript cannot compile our forwards); the user's
    model stays patched, and a deepcopy scripts as itself."""
    model = trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, **SMALL), 3)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    vit_fast.apply_vit_fast(model, backend="triton")
    scripted = torch.jit.script(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), expected, rtol=0, atol=0)
    assert all("_vit_fast_original_forward" in b.__dict__ for b in model.blocks)  # still patched
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.head.weight.mul_(2.0)
        torch.testing.assert_close(torch.jit.script(twin)(x), twin(x), rtol=1e-4, atol=1e-5)
    vit_fast.remove_vit_fast(model)
    assert "__prepare_scriptable__" not in model.__dict__


def test_torch_export_of_a_patched_model():
    """backend='triton': the exported graph holds our custom ops and computes what timm computes; backend='auto'
    where the kernels do not run (a CPU): it says so, once, and the graph is timm's."""
    model = trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, **SMALL), 5)
    x = torch.randn(2, 3, 32, 32)
    ops = export_on_the_kernels(model, x, "exported patched model")
    assert {"vit_fast.attention.default", "vit_fast.linear.default"} <= ops
    vit_fast.remove_vit_fast(model)
    vit_fast.apply_vit_fast(model, backend="auto")
    with pytest.warns(UserWarning, match=r"torch.export on cpu \(torch.float32\) records timm's own block forwards"):
        exported = torch.export.export(model, (x,))
    assert not any("vit_fast" in str(n.target) for n in exported.graph.nodes)


# ------------------------------------------------------------------------------ every kind, every mode
def _images(model: torch.nn.Module) -> torch.Tensor:
    """Two images of the model's size."""
    return torch.randn(2, 3, *model.patch_embed.img_size)


def _naflex_padded(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A NaFlex batch of a 1-patch and a 3-patch image (16 px patches): the first padded (key padding, run as
    lengths)."""
    return naflex_batch([(16, 16), (16, 48)], 16, seed=6)


class Row(NamedTuple):
    """A parity row: the timm model and its create_model overrides, and its input for a model built so (an image
    tensor, or a NaFlex batch, which NaFlexVit's forward and forward_intermediates take as a dict)."""

    name: str
    kwargs: dict[str, Any]
    inputs: Callable[[torch.nn.Module], Inputs] = _images


#: one tiny model per model class, block kind, attention and head apply_vit_fast runs (head dims of 16 and up)
PARITY = {
    "VisionTransformer Block": Row("vit_tiny_patch16_224", dict(SMALL, img_size=32)),
    "Block with RmsNorm (test_vit4)": Row("test_vit4", dict(depth=2, img_size=32)),
    "Block with DiffAttention": Row("vit_dwee_patch16_reg1_gap_256", dict(SMALL, img_size=32)),
    "ResPostBlock": Row("vit_base_patch16_rpn_224", dict(SMALL, img_size=32)),
    "ParallelThingsBlock": Row("vit_small_patch16_18x2_224", dict(SMALL, img_size=32)),
    "ParallelScalingBlock (RmsNorm, qk-norm)": Row("vit_base_patch16_xp_224", dict(SMALL, img_size=32)),
    "DiffParallelScalingBlock": Row("vit_dpwee_patch16_reg1_gap_256", dict(SMALL, img_size=32)),
    "VisionTransformerDistilled": Row("deit_tiny_distilled_patch16_224", dict(SMALL, img_size=32)),
    "AttentionPoolLatent head": Row("vit_base_patch16_siglip_224", dict(SMALL, img_size=32)),
    "NaFlexVit, padded (map head, register)": Row("naflexvit_base_patch16_map", dict(SMALL), _naflex_padded),
    "Eva, EvaBlock with RoPE (DINOv3: half layout, registers)": Row(
        "vit_small_patch16_dinov3", dict(SMALL, img_size=32)
    ),
}
TIMM_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "eval_with_grad": torch.enable_grad}


def _parity_model(case: str) -> torch.nn.Module:
    name, kwargs, _ = PARITY[case]
    torch.manual_seed(0)
    return trained_like(timm.create_model(name, pretrained=False, **kwargs), seed=4)


def _kinds(model: torch.nn.Module) -> set[str]:
    """The model's class, its blocks' classes, their attentions' and its attention-pool head's."""
    kinds = {type(model).__name__, type(getattr(model, "attn_pool", None)).__name__}
    for block in model.blocks:
        kinds.add(type(block).__name__)
        attns = [getattr(block, "attn", None), *(b.attn for b in getattr(block, "attns", ()))]
        kinds.update(type(a).__name__ for a in attns if a is not None)
    return kinds


def test_every_kind_apply_vit_fast_takes_has_a_parity_row():
    """The model classes and block kinds timm_blocks runs, differential attention and the attention-pool head each
    appear in a parity row; the model classes it refuses each have a refusal row."""
    seen = set().union(*(_kinds(_parity_model(case)) for case in PARITY))
    wanted = {
        *timm_reading.MODEL_CLASSES,
        *timm_reading.BLOCK_KINDS,
        "Attention",
        "DiffAttention",
        "AttentionPoolLatent",
    }
    assert wanted <= seen, sorted(wanted - seen)
    refused = {type(timm.create_model(name, pretrained=False, **kw)).__name__ for name, kw, _ in REFUSED.values()}
    assert set(timm_reading._REFUSED_MODELS) <= refused


def _attention_launches(model: torch.nn.Module) -> int:
    """Attention kernel launches (plain or differential) of one forward through the blocks."""
    return sum(len(getattr(block, "attns", ())) or 1 for block in model.blocks)


def _padded(x: Inputs) -> bool:
    """Whether some image of a NaFlex batch is padded."""
    return isinstance(x, dict) and not bool(x["patch_valid"].all())


def _valid_tokens(tokens: torch.Tensor, x: Inputs) -> torch.Tensor:
    """``tokens [B, P + T, D]`` (P prefix tokens, then T patches): for a NaFlex batch the prefix tokens and valid
    patches, ``[N, D]`` (padding rows are nobody's output: the rule judges the valid ones); all of them otherwise."""
    if not isinstance(x, dict):
        return tokens
    valid = x["patch_valid"]
    prefix = valid.new_ones(valid.shape[0], tokens.shape[1] - valid.shape[1])
    return tokens[torch.cat([prefix, valid], dim=1)]


def _outputs(model: torch.nn.Module, x: Inputs) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The logits, and forward_intermediates' final tokens and every block's output (``[B, N, D]``; a NaFlex
    batch's at valid tokens)."""
    final, intermediates = model.forward_intermediates(x, output_fmt="NLC")
    blocks = [_valid_tokens(tokens, x) for tokens in intermediates]
    return model(x), _valid_tokens(final, x), blocks


@pytest.mark.parametrize("mode", sorted(TIMM_MODES))
@pytest.mark.parametrize("case", sorted(PARITY))
def test_patched_kind_matches_the_unpatched_model(case, mode, monkeypatch):
    """A deep copy patched with backend="triton" against the unpatched original on the same weights and input (the
    row's: images, or a padded NaFlex batch): logits, final tokens and every block's output (at valid tokens) within
    the numerics rule against the unpatched model in float64, with autograd off, in inference mode, and in eval with
    autograd on; every block ran on the kernels and its attention (and a map head's) launched its kernel (or, for a
    padded batch, PyTorch's attention), so a fallback to timm's forward cannot pass."""
    model = _parity_model(case)
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton")
    ref64 = copy.deepcopy(model).double()
    x = PARITY[case].inputs(model)
    with torch.no_grad():
        eager, expected = _outputs(model, x), _outputs(ref64, as_float64(x))
    runs, head_runs = count_calls(monkeypatch, BlockPlan), count_calls(monkeypatch, PoolPlan)
    with TIMM_MODES[mode]():
        ours, launched = kernel_launches(lambda: _outputs(patched, x))
    assert ours[0].requires_grad == (mode == "eval_with_grad")
    map_head = int(type(getattr(patched, "attn_pool", None)).__name__ == "AttentionPoolLatent")
    # the blocks run twice (model(x) and forward_intermediates), the head once (forward_intermediates stops before it)
    assert (len(runs), len(head_runs)) == (2 * len(patched.blocks), map_head), launched
    assert_attention_launches(launched, 2 * _attention_launches(patched), pool=map_head, padded=_padded(x))
    (logits, final, blocks), (e_logits, e_final, e_blocks), (r_logits, r_final, r_blocks) = ours, eager, expected
    assert_within_eager(logits.detach(), e_logits, r_logits, name=f"{case} {mode} logits")
    assert_within_eager(final.detach(), e_final, r_final, name=f"{case} {mode} final tokens")
    assert len(blocks) == len(model.blocks)
    for i, (o, e, r) in enumerate(zip(blocks, e_blocks, r_blocks, strict=True)):
        assert_within_eager(o.detach(), e, r, name=f"{case} {mode} block {i}")


def _grads(model: torch.nn.Module, x: Inputs) -> dict[str, torch.Tensor]:
    """d(logits . fixed weight)/d(input pixels or patches, every parameter), autograd on, the model in eval."""
    x, pixels = requiring_grad(x)
    out = model(x)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    names, params = zip(*model.named_parameters(), strict=True)
    grads = torch.autograd.grad((out * weight).sum(), (pixels, *params), allow_unused=True)
    return {name: g for name, g in zip(("input", *names), grads, strict=True) if g is not None}


@pytest.mark.parametrize(
    "case",
    [
        "VisionTransformer Block",
        "Block with RmsNorm (test_vit4)",
        "ParallelScalingBlock (RmsNorm, qk-norm)",
        "AttentionPoolLatent head",
        "NaFlexVit, padded (map head, register)",
    ],
)
def test_eval_with_grad_runs_the_kernels_and_their_gradients_match(case, monkeypatch):
    """An eval model called without torch.no_grad() (parameters requiring grad, as timm's own tests call it): the
    blocks run on the kernels (NaFlexVit on a padded batch), and the gradients w.r.t. the input and every parameter
    are within the numerics rule of the unpatched model's, both against the unpatched model in float64 (the ops'
    backward recomputes eagerly)."""
    model = _parity_model(case)
    patched = vit_fast.apply_vit_fast(copy.deepcopy(model), backend="triton")
    x = PARITY[case].inputs(model)
    eager, expected = _grads(model, x), _grads(copy.deepcopy(model).double(), as_float64(x))
    runs, head_runs = count_calls(monkeypatch, BlockPlan), count_calls(monkeypatch, PoolPlan)
    ours, launched = kernel_launches(lambda: _grads(patched, x))
    map_head = int(type(getattr(patched, "attn_pool", None)).__name__ == "AttentionPoolLatent")
    assert (len(runs), len(head_runs)) == (len(patched.blocks), map_head), launched
    assert_attention_launches(launched, _attention_launches(patched), pool=map_head, padded=_padded(x))
    assert set(ours) == set(eager) == set(expected)
    for name in ours:
        assert_within_eager(ours[name], eager[name], expected[name], name=f"{case} grad {name}")


@pytest.mark.parametrize("grad", [True, False])
def test_training_mode_runs_timms_own_forward(grad):
    """Training mode (dropout, drop path) keeps timm's forward, with autograd on or off."""
    patched = vit_fast.apply_vit_fast(_parity_model("AttentionPoolLatent head"), backend="triton").train()
    with torch.set_grad_enabled(grad):
        _, launched = kernel_launches(lambda: patched(torch.randn(2, 3, 32, 32)))
    assert sum(launched.values()) == 0, launched
