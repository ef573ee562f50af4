"""Export to ONNX and TensorRT, installed as ``vit_fast.export``; every artifact is verified."""
