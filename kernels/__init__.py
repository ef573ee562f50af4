"""Triton kernels, installed as ``vit_fast.kernels``: one file per fused op.

Each file holds the kernel, its launcher (input checks, grid), a ``torch.library`` custom op
with a fake implementation, and the eager reference ``<op>_ref`` it is tested against.
Importing this package never touches a GPU driver.
"""
