"""transformers' released ``ModelTesterMixin`` (tests/test_modeling_common.py of the installed version, fetched
from PyPI by tools/peers/fetch_transformers_tests.py) run on tiny ViT, DeiT, DINOv2, CLIP-vision and SigLIP-vision
configs. These testers are vit-fast's own (the sdist does not carry tests/models/*): same shape of tester as
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
