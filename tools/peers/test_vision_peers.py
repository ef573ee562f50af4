"""transformers' released ``ModelTesterMixin`` (tests/test_modeling_common.py of the installed version, fetched
from PyPI by tools/peers/fetch_transformers_tests.py) run on tiny ViT, DeiT, DINOv2, DINOv3, CLIP-vision, SigLIP-vision
and SigLIP 2 configs (Siglip2VisionModel, Siglip2ForImageClassification, Siglip2Model: a padded batch of images at their
own sizes). These testers are vit-fast's own (the sdist does not carry tests/models/*): same shape of tester as
transformers' per-model files, with head_dim 16 so that our attention kernel covers them. Run by ``make peers-hf``
unpatched, with apply_vit_fast and with optimize (conftest.py beside the harness)."""

import unittest

import torch
import transformers
from transformers.testing_utils import require_torch

from ...test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor


class VisionTester:
    def __init__(self, parent, config_class, extra=None, cls_token=True, batch_size=3, image_size=16, patch_size=4):
        self.parent, self.config_class, self.extra = parent, config_class, dict(extra or {})
        self.batch_size, self.image_size, self.patch_size, self.num_channels = batch_size, image_size, patch_size, 3
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = 32, 2, 2  # head_dim 16
        self.is_training, self.type_sequence_label_size = True, 5
        num_patches = (image_size // patch_size) ** 2
        self.seq_length = num_patches + int(cls_token) + self.extra.pop("_extra_tokens", 0)
        # bool_masked_pos for the models that take it (ViT, DeiT, DINOv2), as transformers' own testers set it
        self.num_masks, self.mask_length = int(0.5 * self.seq_length), num_patches

    def get_config(self):
        return self.config_class(
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            initializer_range=0.02,
            attn_implementation="eager",
            **self.extra,
        )

    def prepare_config_and_inputs_for_common(self):
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        return self.get_config(), {"pixel_values": pixel_values}


class _VisionTest(ModelTesterMixin):
    test_resize_embeddings = False
    has_attentions = True

    def test_inputs_embeds(self):
        self.skipTest("vision models take pixel_values, not inputs_embeds")

    def test_model_get_set_embeddings(self):
        """A vision model's input embedding is its patch embedding (a module, not a token table), as transformers'
        own vision testers check it; its output embedding is none or a Linear."""
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), torch.nn.Module)
            output = model.get_output_embeddings()
            self.assertTrue(output is None or isinstance(output, torch.nn.Linear))

    def test_model_forward_shapes(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config).eval()
            with torch.no_grad():
                out = model(**inputs)
            hidden = getattr(out, "last_hidden_state", None)
            if hidden is not None:
                t = self.model_tester
                self.assertEqual(tuple(hidden.shape), (t.batch_size, t.seq_length, t.hidden_size))

    def test_labels_give_a_loss(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        config.num_labels = self.model_tester.type_sequence_label_size
        for model_class in self.all_model_classes:
            if "ImageClassification" not in model_class.__name__ or "Teacher" in model_class.__name__:
                continue
            model = model_class(config).eval()
            labels = ids_tensor([self.model_tester.batch_size], config.num_labels)
            self.assertTrue(torch.isfinite(model(**inputs, labels=labels).loss))


@require_torch
class ViTPeerTest(_VisionTest, unittest.TestCase):
    all_model_classes = (transformers.ViTModel, transformers.ViTForImageClassification)

    def setUp(self):
        self.model_tester = VisionTester(self, transformers.ViTConfig, {"intermediate_size": 48})


@require_torch
class DeiTPeerTest(_VisionTest, unittest.TestCase):
    all_model_classes = (transformers.DeiTModel, transformers.DeiTForImageClassification)

    def setUp(self):
        extra = {"intermediate_size": 48, "_extra_tokens": 1}  # the distillation token
        self.model_tester = VisionTester(self, transformers.DeiTConfig, extra)


@require_torch
class Dinov2PeerTest(_VisionTest, unittest.TestCase):
    all_model_classes = (transformers.Dinov2Model, transformers.Dinov2ForImageClassification)

    def setUp(self):
        self.model_tester = VisionTester(self, transformers.Dinov2Config, {"mlp_ratio": 2, "use_swiglu_ffn": True})


@require_torch
class CLIPVisionPeerTest(_VisionTest, unittest.TestCase):
    all_model_classes = (transformers.CLIPVisionModel,)

    def setUp(self):
        self.model_tester = VisionTester(self, transformers.CLIPVisionConfig, {"intermediate_size": 48})


@require_torch
class SiglipVisionPeerTest(_VisionTest, unittest.TestCase):
    all_model_classes = (transformers.SiglipVisionModel,)

    def setUp(self):
        extra = {"intermediate_size": 48}
        self.model_tester = VisionTester(self, transformers.SiglipVisionConfig, extra, cls_token=False)


@require_torch
class DINOv3PeerTest(_VisionTest, unittest.TestCase):
    all_model_classes = (transformers.DINOv3ViTModel,)

    def setUp(self):
        # RoPE rotated in our attention kernel; 2 register tokens; SwiGLU (SiLU's gate in the fc1 GEMM's epilogue)
        extra = {"intermediate_size": 48, "num_register_tokens": 2, "_extra_tokens": 2}
        extra.update(use_gated_mlp=True, hidden_act="silu")
        self.model_tester = VisionTester(self, transformers.DINOv3ViTConfig, extra)


SHAPES = ((4, 4), (2, 3), (3, 4), (1, 5), (4, 4), (2, 2), (3, 3))


class Siglip2Tester:
    """SigLIP 2's inputs (native resolution): each image's patches flattened (``[T, C * p * p]``) and packed, the batch
    padded at the end to ``seq_length`` patches, ``pixel_attention_mask [B, T]`` (1: an image's patch) and
    ``spatial_shapes [B, 2]`` (each image's patch grid). ``shapes``: the grids of the batch's images, by default two
    that fill the sequence and five padded ones, so the layers and the attention-pool head see key padding (our
    kernels take it as per-sample lengths); seven, the batch the mixin's eager-vs-sdpa test runs (with fewer it
    would pad the batch with random masks and grids). ``model``: "vision" (a Siglip2VisionConfig),
    "classification" or "dual" (a Siglip2Config; "dual" also has a tiny text tower and its inputs, for
    Siglip2Model)."""

    def __init__(self, parent, model="vision", shapes=SHAPES, patch_size=4):
        self.parent, self.model, self.shapes = parent, model, shapes
        self.batch_size, self.patch_size, self.num_channels = len(shapes), patch_size, 3
        self.seq_length = 16  # positions of the padded batch; the position-embedding grid is 4 x 4 (num_patches)
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = 32, 2, 2  # head_dim 16
        self.is_training, self.type_sequence_label_size = True, 5
        self.text_seq_length, self.vocab_size = 7, 99

    def get_config(self):
        tower = {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": 48,
        }
        # Siglip2ForImageClassification average-pools the last hidden state: the tower's attention-pool head would
        # be built and never called (parameters without a gradient, which the mixin's training tests reject)
        vision = transformers.Siglip2VisionConfig(
            num_patches=self.seq_length,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            vision_use_head=self.model != "classification",
            **tower,
        )
        if self.model == "vision":
            vision._attn_implementation = "eager"
            return vision
        text = transformers.Siglip2TextConfig(vocab_size=self.vocab_size, max_position_embeddings=16, **tower)
        config = transformers.Siglip2Config(text_config=text.to_dict(), vision_config=vision.to_dict())
        config._attn_implementation = "eager"
        return config

    def prepare_config_and_inputs_for_common(self):
        width = self.num_channels * self.patch_size**2
        pixel_values = floats_tensor([self.batch_size, self.seq_length, width])
        mask = torch.zeros(self.batch_size, self.seq_length, dtype=torch.long)
        for i, (h, w) in enumerate(self.shapes):
            mask[i, : h * w] = 1
        pixel_values = pixel_values * mask[..., None]  # padding patches are zeros, as the processor pads them
        inputs = {
            "pixel_values": pixel_values,
            "pixel_attention_mask": mask,
            "spatial_shapes": torch.tensor(self.shapes, dtype=torch.long),
        }
        if self.model == "dual":
            text_mask = torch.ones(self.batch_size, self.text_seq_length, dtype=torch.long)
            text_mask[1:, -2:] = 0  # right padding
            inputs.update(
                input_ids=ids_tensor([self.batch_size, self.text_seq_length], self.vocab_size),
                attention_mask=text_mask,
            )
        return self.get_config(), inputs


class _Siglip2Test(_VisionTest):
    #: what the mixin's eager-vs-sdpa test passes besides the main input (it would pass pixel_values alone)
    additional_model_inputs = ["pixel_attention_mask", "spatial_shapes"]


@require_torch
class Siglip2VisionPeerTest(_Siglip2Test, unittest.TestCase):
    all_model_classes = (transformers.Siglip2VisionModel,)

    def setUp(self):
        self.model_tester = Siglip2Tester(self)


@require_torch
class Siglip2ForImageClassificationPeerTest(_Siglip2Test, unittest.TestCase):
    all_model_classes = (transformers.Siglip2ForImageClassification,)

    def setUp(self):
        self.model_tester = Siglip2Tester(self, "classification")


@require_torch
class Siglip2PeerTest(_Siglip2Test, unittest.TestCase):
    """Siglip2Model: its vision tower patched, its text tower transformers' own. Its output holds each tower's own
    (``vision_model_output``, ``text_model_output``), of two sequence lengths: the mixin's checks of one
    ``hidden_states`` / ``attentions`` do not apply to it (Siglip2VisionPeerTest runs them on the vision tower)."""

    all_model_classes = (transformers.Siglip2Model,)
    additional_model_inputs = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]  # main input: input_ids
    _is_composite = True
    test_attention_outputs = False

    def test_hidden_states_output(self):
        self.skipTest("a dual model's output has each tower's hidden states, not one hidden_states")

    def test_retain_grad_hidden_states_attentions(self):
        self.skipTest("a dual model's output has each tower's hidden states and attentions, not one of each")

    def setUp(self):
        self.model_tester = Siglip2Tester(self, "dual")
