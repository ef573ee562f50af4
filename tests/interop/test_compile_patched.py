"""torch.compile(fullgraph=True) of a model patched in place: Dynamo traces a patched transformers model in one graph
in each grad mode, with our kernels' custom ops in it, and SigLIP 2's and NaFlexVit's padded batches keep the kernels
(the key-padding mask read as lengths in the graph). The graphs run with backend="eager" (Triton's interpreter
behind the custom ops); inductor on a CPU is not what is checked here."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")
timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it)")

import vit_fast  # noqa: E402
from vit_fast.interop.naflex import key_padding_lengths  # noqa: E402

from ..fakes import kernel_launches, naflex_batch, siglip2_batch  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=4, intermediate_size=64)
MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "eval_with_grad": torch.enable_grad}


def _compiled(model: torch.nn.Module, fullgraph: bool = True) -> tuple[torch.nn.Module, set[str]]:
    """``model`` under torch.compile(fullgraph=...) with a backend that records the ops of each graph Dynamo
    makes and runs it as it is (eager)."""
    torch._dynamo.reset()
    targets: set[str] = set()

    def record(graph: torch.fx.GraphModule, example_inputs):
        targets.update(str(node.target) for node in graph.graph.nodes if node.op == "call_function")
        return graph.forward

    return torch.compile(model, fullgraph=fullgraph, backend=record), targets


def _vit(backend: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    config = transformers.ViTConfig(image_size=16, **TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.ViTModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model, vit_fast.optimize(model, backend=backend)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_patched_transformers_model_compiles_fullgraph_with_our_ops_in_every_grad_mode(mode):
    model, patched = _vit("triton")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        eager = model(pixel_values=x).last_hidden_state
        expected = copy.deepcopy(model).double()(pixel_values=x.double()).last_hidden_state
    compiled, targets = _compiled(patched)
    with MODES[mode]():
        ours, launched = kernel_launches(lambda: compiled(pixel_values=x).last_hidden_state)
    ops = {t for t in targets if t.startswith("vit_fast.")}
    assert {"vit_fast.attention.default", "vit_fast.linear.default"} <= ops, sorted(targets)
    assert launched["_attention_kernel"] == 2, launched
    assert ours.requires_grad == (mode == "eval_with_grad")
    assert_within_eager(ours.detach(), eager, expected, name=f"compiled ViTModel {mode}")


def test_a_model_patched_for_auto_on_a_cpu_compiles_as_transformers_own():
    """backend "auto" on a CPU runs transformers' forward: the graph holds none of our ops, as the unpatched model's."""
    model, patched = _vit("auto")
    x = torch.randn(2, 3, 16, 16)
    compiled, targets = _compiled(patched)
    with torch.no_grad():
        torch.testing.assert_close(compiled(pixel_values=x).last_hidden_state, model(pixel_values=x).last_hidden_state)
    assert targets and not any(t.startswith("vit_fast.") for t in targets)
    unpatched, _ = _compiled(model)
    with torch.no_grad():
        unpatched(pixel_values=x)  # the unpatched model compiles too


def test_siglip2_padded_batch_keeps_the_kernels_under_compile():
    """SigLIP 2 on a padded batch: the encoder layers' key-padding mask read as lengths in the graph, the attention
    kernel launched by each layer (its pooling head runs in PyTorch, as it does for a padded batch eagerly)."""
    config = transformers.Siglip2VisionConfig(num_patches=16, **TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Siglip2VisionModel(config).eval()
    inputs = siglip2_batch([(2, 2), (2, 4)], TINY["patch_size"], seed=5)
    with torch.no_grad():
        eager = model(**inputs).pooler_output
        expected = (
            copy.deepcopy(model)
            .double()(**{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})
            .pooler_output
        )
    compiled, targets = _compiled(vit_fast.optimize(model, backend="triton"))
    with torch.no_grad():
        ours, launched = kernel_launches(lambda: compiled(**inputs).pooler_output)
    assert launched["_attention_kernel"] == 2 and "vit_fast.attention.default" in targets, launched
    assert_within_eager(ours, eager, expected, name="compiled Siglip2VisionModel, padded")


def test_naflexvit_padded_batch_keeps_the_kernels_under_compile():
    """timm's NaFlexVit breaks the graph itself (its position-embedding resize is torch.compiler.disable'd, patched or
    not), so not fullgraph here: its blocks' graph holds our ops and the attention kernel runs on the padded batch."""
    torch.manual_seed(0)
    model = timm.create_model(
        "naflexvit_base_patch16_gap", pretrained=False, num_classes=8, depth=2, embed_dim=32, num_heads=2
    )
    model.eval()
    batch = naflex_batch([(32, 16), (16, 16)], 16, seed=2)
    assert not bool(batch["patch_valid"].all())  # padded
    run = lambda m, b: m(b["patches"], patch_coord=b["patch_coord"], patch_valid=b["patch_valid"])  # noqa: E731
    with torch.no_grad():
        eager = run(model, batch)
        expected = run(copy.deepcopy(model).double(), dict(batch, patches=batch["patches"].double()))
    compiled, targets = _compiled(vit_fast.apply_vit_fast(model, backend="triton"), fullgraph=False)
    with torch.no_grad():
        ours, launched = kernel_launches(lambda: run(compiled, batch))
    assert launched["_attention_kernel"] == 2 and "vit_fast.attention.default" in targets, launched
    assert_within_eager(ours, eager, expected, name="compiled NaFlexVit, padded")


def test_a_mask_other_than_key_padding_raises_under_compile_instead_of_running_wrong():
    """Eagerly such a mask makes the layer run its own forward; a graph cannot branch on the data, so the check is an
    assertion in the graph that names the mask and what to do."""
    holes = torch.tensor([[True, False, True, True], [True, True, True, False]])
    assert key_padding_lengths(holes, 2, 4) is None
    read = torch.compile(lambda m: key_padding_lengths(m, 2, 4), fullgraph=True, backend="eager")
    torch.testing.assert_close(read(holes.sort(-1, descending=True).values), torch.tensor([3, 3], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"not: run this model with remove_vit_fast"):
        read(holes)
