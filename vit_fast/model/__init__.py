"""The Vision Transformer itself: its config and presets, its layers with timm's names, the module, input
validation, timm's model API on it, and the warm start and self-check at a model's own shapes."""
