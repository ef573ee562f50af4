"""Which transformers classes ``apply_vit_fast`` / ``optimize`` patch, and which they refuse with the reason: the
tables :mod:`vit_fast.interop.hf_patch` reads, by class name, and where a vision-language model keeps its vision
tower. The list and the reasons: docs/usage.md, "Hugging Face transformers: the drop-in"."""

from __future__ import annotations

from torch import nn

#: layer class -> (attention attribute, attention output projection, norm before attention, norm before the
#: MLP, LayerScale after attention or None, LayerScale after the MLP or None)
LAYOUTS: dict[str, tuple[str, str, str, str, str | None, str | None]] = {
    "ViTLayer": ("attention", "o_proj", "layernorm_before", "layernorm_after", None, None),
    "DeiTLayer": ("attention", "o_proj", "layernorm_before", "layernorm_after", None, None),
    "ViTMAELayer": ("attention", "o_proj", "layernorm_before", "layernorm_after", None, None),
    "ViTMSNLayer": ("attention", "o_proj", "layernorm_before", "layernorm_after", None, None),
    "IJepaLayer": ("attention", "o_proj", "layernorm_before", "layernorm_after", None, None),
    "Dinov2Layer": ("attention", "o_proj", "norm1", "norm2", "layer_scale1", "layer_scale2"),
    "Dinov2WithRegistersLayer": ("attention", "o_proj", "norm1", "norm2", "layer_scale1", "layer_scale2"),
    "DINOv3ViTLayer": ("attention", "o_proj", "norm1", "norm2", "layer_scale1", "layer_scale2"),  # RoPE: hf_dinov3
    "CLIPEncoderLayer": ("self_attn", "out_proj", "layer_norm1", "layer_norm2", None, None),
    "SiglipEncoderLayer": ("self_attn", "out_proj", "layer_norm1", "layer_norm2", None, None),
    "Siglip2EncoderLayer": ("self_attn", "out_proj", "layer_norm1", "layer_norm2", None, None),
    "Idefics3EncoderLayer": ("self_attn", "out_proj", "layer_norm1", "layer_norm2", None, None),
}
#: the model classes accepted, by family (their modeling module's name); their vision encoder layers are patched
SUPPORTED = {
    "vit": ("ViTModel", "ViTForImageClassification", "ViTForMaskedImageModeling"),
    "deit": (
        "DeiTModel",
        "DeiTForImageClassification",
        "DeiTForImageClassificationWithTeacher",
        "DeiTForMaskedImageModeling",
    ),
    "dinov2": ("Dinov2Model", "Dinov2ForImageClassification", "Dinov2Backbone"),
    "dinov2_with_registers": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersForImageClassification",
        "Dinov2WithRegistersBackbone",
    ),
    "dinov3_vit": ("DINOv3ViTModel", "DINOv3ViTBackbone"),  # RoPE in the attention kernel (hf_dinov3)
    "vit_mae": ("ViTMAEModel", "ViTMAEForPreTraining"),  # the encoder and the decoder's ViT layers
    "vit_msn": ("ViTMSNModel", "ViTMSNForImageClassification"),
    "ijepa": ("IJepaModel", "IJepaForImageClassification"),
    "clip": ("CLIPVisionModel", "CLIPVisionModelWithProjection", "CLIPModel", "CLIPForImageClassification"),
    "siglip": ("SiglipVisionModel", "SiglipModel", "SiglipForImageClassification"),
    # padded batches of images at their own sizes: vit_fast.interop.naflex
    "siglip2": ("Siglip2VisionModel", "Siglip2Model", "Siglip2ForImageClassification"),
    # vision-language models: their vision tower (VLM_TOWERS) is patched, the language model left alone
    "llava": ("LlavaModel", "LlavaForConditionalGeneration"),
    "paligemma": ("PaliGemmaModel", "PaliGemmaForConditionalGeneration"),
    "idefics3": ("Idefics3VisionTransformer", "Idefics3Model", "Idefics3ForConditionalGeneration"),
}
SUPPORTED_NAMES = frozenset(name for names in SUPPORTED.values() for name in names)
#: a vision-language model class -> where its vision tower is (``get_submodule``)
VLM_TOWERS = {
    "LlavaModel": "vision_tower",
    "LlavaForConditionalGeneration": "model.vision_tower",
    "PaliGemmaModel": "vision_tower",
    "PaliGemmaForConditionalGeneration": "model.vision_tower",
    "Idefics3Model": "vision_model",
    "Idefics3ForConditionalGeneration": "model.vision_model",
}
#: the tower classes a vision-language model may hold for its tower to be patched
TOWER_CLASSES = ("CLIPVisionModel", "SiglipVisionModel", "Siglip2VisionModel", "Idefics3VisionTransformer")
_TEXT_ONLY = "a text-only model: it has no vision tower to patch"
_REL_POS = "relative position bias inside attention, which vit-fast's attention kernel does not add"
_WINDOWED = (
    "windowed attention with relative position embeddings (a ViTDet encoder), which vit-fast's kernels do not run"
)
#: model classes refused by name, with the reason
REFUSED = {
    "CLIPTextModel": _TEXT_ONLY,
    "CLIPTextModelWithProjection": _TEXT_ONLY,
    "SiglipTextModel": _TEXT_ONLY,
    "Siglip2TextModel": _TEXT_ONLY,
    **dict.fromkeys(
        (
            "BeitModel",
            "BeitForImageClassification",
            "BeitForMaskedImageModeling",
            "BeitForSemanticSegmentation",
            "BeitBackbone",
            "Data2VecVisionModel",
            "Data2VecVisionForImageClassification",
            "Data2VecVisionForSemanticSegmentation",
        ),
        f"a model with {_REL_POS}",
    ),
    **dict.fromkeys(("SamModel", "SamVisionModel", "VitDetModel", "VitDetBackbone"), f"a model with {_WINDOWED}"),
}


def vision_root(model: nn.Module) -> nn.Module:
    """The module that holds the vision encoder layers: a vision-language model's vision tower, a CLIP / SigLIP dual
    model's ``vision_model``, or the model itself."""
    path = VLM_TOWERS.get(type(model).__name__)
    if path is not None:
        return model.get_submodule(path)
    return getattr(model, "vision_model", None) or model


def class_refusal(model: nn.Module) -> str | None:
    """Why this transformers model is refused by its class (or its vision tower's), as the error says it; None when
    its class is one vit-fast patches."""
    name = type(model).__name__
    if name in REFUSED:
        return f"{name} is {REFUSED[name]}"
    if name not in SUPPORTED_NAMES:
        families = ", ".join(sorted(SUPPORTED_NAMES))
        return f"{name} is not a class vit-fast patches; the transformers models it patches are {families}"
    tower = type(vision_root(model)).__name__
    if name in VLM_TOWERS and tower not in TOWER_CLASSES:
        why = f"{tower} is {REFUSED[tower]}" if tower in REFUSED else f"vit-fast patches {', '.join(TOWER_CLASSES)}"
        return f"{name}'s vision tower is a {tower} ({why}): run this model as it is"
    return None
