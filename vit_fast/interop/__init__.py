"""Models from elsewhere: checkpoints, converting timm and Hugging Face models, loading a model by name, and
our kernels patched into a user's own timm / transformers model in place (NaFlexVit and SigLIP 2 included)."""
