"""Serving: ``vit-fast serve`` through PyTriton (a real Triton Inference Server), the python-backend
model for ``vit-fast export tritonserver``'s python entry, and a bounded load-test client.

Nothing here imports pytriton or tritonclient at import time; they come with the ``serve`` extra
(``pip install -e '.[serve]'`` in a vit-fast checkout), which pins numpy < 2 as PyTriton requires.
"""
