"""vit_fast.explain's answer used as the text it prints (``"..." + explanation``, ``in``), and the device it names:
the one asked for, with where the weights are when that differs (a model on the CPU explained for ``cuda:7``)."""

from __future__ import annotations

import pytest
import torch

import vit_fast

transformers = pytest.importorskip("transformers", reason="transformers is not installed (make setup installs it)")


def _hf() -> torch.nn.Module:
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=16, patch_size=4
    )
    return transformers.ViTModel(config).eval()


def _own() -> torch.nn.Module:
    cfg = vit_fast.ViTConfig(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    return vit_fast.VisionTransformer(cfg, backend="torch").eval()


@pytest.mark.parametrize("make", [_hf, _own], ids=["transformers", "vit_fast"])
def test_an_explanation_adds_to_a_str_as_its_text(make):
    report = vit_fast.explain(make())
    text = str(report)
    assert "explained:\n" + report == "explained:\n" + text
    assert report + "\n--" == text + "\n--"
    assert "backend: " in report and "no such line" not in report
    with pytest.raises(TypeError):
        report + 1  # noqa: B018 (only text adds to it)
    with pytest.raises(TypeError):
        1 + report  # noqa: B018


@pytest.mark.parametrize("make", [_hf, _own], ids=["transformers", "vit_fast"])
def test_a_device_asked_for_is_named_beside_where_the_weights_are(make):
    model = make()
    asked = vit_fast.explain(model, "cuda:7")
    assert asked.device == "cuda:7" and asked.weights_on == "cpu"
    first = str(asked).splitlines()[0]
    assert "with its weights on cpu, explained for cuda:7 as asked (float32)" in first, first
    assert " on cuda:7" not in first
    here = vit_fast.explain(model)
    assert here.device == "cpu" and here.weights_on is None
    assert str(here).splitlines()[0].split(" (")[0].endswith(" on cpu")
    same = vit_fast.explain(model, "cpu")
    assert same.weights_on is None and str(same) == str(here)
