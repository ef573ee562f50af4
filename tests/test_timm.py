"""timm interop. timm needs torchvision, which has no CPU build on our CPU machines, so these tests
run where timm imports (the GPU machine has it) and skip elsewhere with that reason."""

import pytest
import torch

timm = pytest.importorskip(
    "timm", reason="timm is not importable here (it needs torchvision, which has no CPU build on this machine)"
)

import vit_fast  # noqa: E402

CASES = {
    "vit_tiny_patch16_224": dict(img_size=64, depth=2),
    "deit_small_patch16_224": dict(img_size=48, depth=1),
    "vit_base_patch16_reg4_gap_256": dict(img_size=64, depth=1),
    "vit_small_patch14_reg4_dinov2": dict(img_size=56, depth=1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_timm_matches(name):
    torch.manual_seed(0)
    ref = timm.create_model(name, pretrained=False, **CASES[name]).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = vit_fast.from_timm(ref).eval()
    x = torch.randn(2, 3, CASES[name]["img_size"], CASES[name]["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), ref.forward_features(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
    # the state_dict loads as it is, both ways
    ours = vit_fast.VisionTransformer(model.cfg, backend="torch")
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())


def test_timm_dynamic_img_size():
    ref = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=64, depth=1, dynamic_img_size=True
    ).eval()
    model = vit_fast.optimize(ref).eval()
    x = torch.randn(1, 3, 96, 80)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
