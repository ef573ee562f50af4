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
        (dict(depth=0), r"depth must be a positive int, got 0"),
        (dict(reg_tokens=-1), r"reg_tokens must be an int >= 0, got -1"),
        (dict(num_classes=-2), r"num_classes must be an int >= 0"),
        (dict(layer_norm_eps=0.0), r"layer_norm_eps must be > 0"),
        (dict(init_values=-1.0), r"init_values \(LayerScale\) must be > 0 or None"),
        (dict(mlp_ratio=0), r"mlp_ratio must be > 0"),
        (dict(img_size=(1, 2, 3)), r"img_size must be an int or a pair"),
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
