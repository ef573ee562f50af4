import pytest

import vit_fast
from vit_fast import PRESETS, ViTConfig

REQUIRED_PRESETS = [
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "vit_large_patch16_224",
    "vit_huge_patch14_224",
    "vit_base_patch32_224",
    "vit_base_patch16_384",
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "deit_base_patch16_224",
]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_derives(name):
    cfg = ViTConfig.from_name(name)
    assert cfg.num_patches == cfg.grid_size[0] * cfg.grid_size[1]
    assert cfg.num_tokens == cfg.num_patches + int(cfg.class_token) + cfg.reg_tokens
    assert cfg.head_dim * cfg.num_heads == cfg.embed_dim


def test_required_presets_and_register_variant():
    for name in REQUIRED_PRESETS:
        assert name in PRESETS
    assert any(cfg.get("reg_tokens", 0) > 0 for cfg in PRESETS.values())
    assert vit_fast.PRESETS is PRESETS


def test_vit_base_numbers():
    cfg = ViTConfig.from_name("vit_base_patch16_224")
    assert (cfg.num_tokens, cfg.head_dim, cfg.mlp_hidden_dim) == (197, 64, 3072)
    assert ViTConfig.from_name("vit_base_patch16_384").num_tokens == 577
    assert ViTConfig.from_name("vit_base_patch16_reg4_gap_256").num_tokens == 256 + 4


def test_overrides_and_round_trip():
    cfg = ViTConfig.from_name("vit_tiny_patch16_224", num_classes=0, img_size=(224, 160))
    assert cfg.grid_size == (14, 10)
    again = ViTConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert ViTConfig.from_dict(__import__("json").loads(cfg.to_json())) == cfg


def test_unknown_preset_suggests():
    with pytest.raises(KeyError, match="vit_base_patch16_224"):
        ViTConfig.from_name("vit_base_patch16_22")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(embed_dim=100, num_heads=3), r"embed_dim 100 is not divisible by num_heads 3"),
        (dict(img_size=225, patch_size=16), r"img_size 225x225 is not divisible by patch_size 16.*224x224"),
        (dict(img_size=(224, 200), patch_size=16), r"224x200 is not divisible by patch_size 16"),
        (dict(global_pool="max"), r"global_pool must be one of \('token', 'avg'\), got 'max'"),
        (dict(class_token=False), r"global_pool='token' needs a class token"),
        (dict(act="relu"), r"act must be one of"),
        (dict(depth=0), r"ViTConfig.depth must be an int >= 1, got 0"),
        (dict(reg_tokens=-1), r"ViTConfig.reg_tokens must be an int >= 0, got -1"),
        (dict(num_classes=-2), r"ViTConfig.num_classes must be an int >= 0"),
        (dict(layer_norm_eps=0.0), r"ViTConfig.layer_norm_eps must be a number > 0"),
        (dict(init_values=-1.0), r"ViTConfig.init_values must be None \(no LayerScale\) or a number > 0"),
        (dict(mlp_ratio=0), r"ViTConfig.mlp_ratio must be a number > 0"),
        (dict(img_size=(1, 2, 3)), r"img_size must be an int or a pair"),
        # wrong types are named with the field, never accepted as truthy or failing far away
        (dict(qkv_bias="no"), r"ViTConfig.qkv_bias must be True or False, got 'no' \(str\)"),
        (dict(class_token=1), r"ViTConfig.class_token must be True or False, got 1 \(int\)"),
        (dict(dynamic_img_size=None), r"ViTConfig.dynamic_img_size must be True or False"),
        (dict(fc_norm="yes"), r"ViTConfig.fc_norm must be True, False or None"),
        (dict(mlp_ratio="4"), r"ViTConfig.mlp_ratio must be a number > 0, got '4' \(str\)"),
        (dict(mlp_ratio=float("nan")), r"ViTConfig.mlp_ratio must be a number > 0"),
        (dict(mlp_ratio=0.001), r"gives an MLP of 0 hidden units .* use mlp_ratio >= 0.0013"),
        (dict(num_classes=10.0), r"ViTConfig.num_classes must be an int >= 0 .*got 10.0 \(float\)"),
        (dict(embed_dim=True), r"ViTConfig.embed_dim must be an int >= 1, got True \(bool\)"),
        (dict(patch_size=16.0), r"ViTConfig.patch_size must be an int >= 1, got 16.0 \(float\)"),
        (dict(img_size="224"), r"ViTConfig.img_size must be an int or a pair of ints"),
        (dict(layer_norm_eps="1e-6"), r"ViTConfig.layer_norm_eps must be a number > 0"),
        (dict(init_values=float("inf")), r"ViTConfig.init_values must be None"),
    ],
)
def test_inconsistent_config_names_the_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**kwargs)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match=r"unknown ViTConfig field\(s\) \['hidden_size'\]"):
        ViTConfig.from_dict({"hidden_size": 3})


def test_fc_norm_follows_timm():
    assert ViTConfig(global_pool="avg").use_fc_norm
    assert not ViTConfig(global_pool="token").use_fc_norm
    assert not ViTConfig(global_pool="avg", fc_norm=False).use_fc_norm


def test_model_constructor_takes_a_config_or_a_preset_name():
    assert vit_fast.VisionTransformer("vit_tiny_patch16_224", backend="torch").cfg.embed_dim == 192
    with pytest.raises(TypeError, match=r"takes a ViTConfig or a preset name, got a dict: pass ViTConfig\(\*\*d\)"):
        vit_fast.VisionTransformer({"img_size": 32})
    with pytest.raises(TypeError, match=r"takes a ViTConfig or a preset name .* got int"):
        vit_fast.VisionTransformer(3)
    with pytest.raises(KeyError, match=r"unknown preset 'vit_nope'"):
        vit_fast.VisionTransformer("vit_nope")
