"""vit_fast.model.selfcheck's inputs: how much memory drawing them takes, counted in bytes (never wall time or the RSS
of a loaded machine). The checks' numerics are tests/apps/test_doctor.py's."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from vit_fast.model import selfcheck
from vit_fast.model.config import ViTConfig


class _NewStorage(TorchDispatchMode):
    """Counts the bytes of every storage an op makes: an output whose storage is none of its inputs' (a view or an
    in-place op makes none)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.bytes += t.untyped_storage().nbytes()
                given.add(t.untyped_storage().data_ptr())
        return out


def _tensor_bytes(value) -> int:
    return sum(t.untyped_storage().nbytes() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def test_inputs_are_drawn_in_their_dtype_with_no_larger_copy():
    """Every case's inputs cost what they hold and no more: drawn in their dtype and scaled in place. Drawn in
    float32, scaled, then cast, a bf16 input cost 5 times its bytes (the dry run of the GPU evidence peaked at
    3 GB on its batch-256 fc2 case)."""
    cfg = ViTConfig.from_name("vit_base_patch16_224")
    cases = selfcheck.model_cases(cfg, batch=1, dtype=torch.bfloat16) + selfcheck.family_cases(dtype=torch.float16)
    assert {c.kernel for c in cases} >= {"linear", "attention", "patch_embed", "preprocess", "diff_attention"}
    for case in cases:
        with _NewStorage() as counted:
            inputs = selfcheck._inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
        held = _tensor_bytes(inputs)
        assert held > 0, case.name
        assert counted.bytes <= held + 64, (case.name, counted.bytes, held)  # 64: a 0-dim lambda's float32 draw


def test_the_counter_sees_a_float32_draw_cast_down():
    """The counter is not blind: the old way of drawing (float32, scaled, cast) is counted at 5x the bf16 bytes."""
    gen = torch.Generator().manual_seed(0)
    with _NewStorage() as counted:
        x = (2.0 * torch.randn((64, 48), generator=gen)).to(torch.bfloat16)
    assert counted.bytes == 5 * _tensor_bytes(x)


def test_every_op_brings_its_self_check():
    """A kernel is one spec: each op's self-check (its launches at a model's sizes, its inputs, its launch into
    poisoned outputs, its shape line, how its reference's output is judged) is its own file's, given to
    ``define_op`` (``OPS[name].spec.selfcheck``); selfcheck.py names no op. Every op is checked at some model's
    shapes."""
    from vit_fast.kernels import OPS

    for name, op in OPS.items():
        spec = op.spec.selfcheck
        assert spec is not None, name
        assert all(map(callable, (spec.cases, spec.inputs, spec.launch, spec.shape, spec.judged))), name
    tiny = ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    cases = selfcheck.model_cases(tiny) + selfcheck.family_cases(max_heads=1)
    assert {c.kernel for c in cases} == set(OPS)
    for case in cases:
        assert case.shape().startswith(("[", "q [", f"{case.dims['batch']} uint8")), case.name
