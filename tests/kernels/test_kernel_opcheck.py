"""The vit_fast custom ops as ``torch.library`` sees them: ``torch.library.opcheck`` on every op
(schema, autograd registration, the fake implementation against the real kernel's shapes, dtypes
and strides, and AOT dispatch with dynamic shapes, forward and the recomputed backward), and each
fake implementation refusing bad inputs with the same error as the public function.

Tiny odd shapes in fp32, so the interpreter runs them in seconds. Each opcheck sub-check is its
own test, so a failure names the check that failed.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vit_fast.kernels import attention, attention_pool, diff_attention, layer_norm, linear, patch_embed, preprocess

OPCHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _randn(device, *shape):
    return torch.randn(*shape, device=device).requires_grad_()


def _patch_embed_args(device):
    # 2 images of 3 x 8 x 12 in 4-px patches (a 2 x 3 grid), class + 2 register tokens, D = 5
    return [
        _randn(device, 2, 3, 8, 12),
        _randn(device, 5, 3, 4, 4),
        _randn(device, 5),
        _randn(device, 1, 3 + 6, 5),
        _randn(device, 1, 1, 5),
        _randn(device, 1, 2, 5),
        None,
        None,
        False,
    ]


def _patch_embed_uint8_args(device):
    # uint8 pixels normalised in the kernel, no bias, pos_embed for the patches only (no_embed_class)
    x = torch.randint(0, 256, (1, 3, 8, 4), dtype=torch.uint8, device=device)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device)
    std = torch.tensor([0.229, 0.224, 0.225], device=device)
    return [
        x,
        _randn(device, 7, 3, 4, 4),
        None,
        _randn(device, 1, 2, 7),
        _randn(device, 1, 1, 7),
        None,
        mean,
        std,
        True,
    ]


def _patch_embed_public(x, weight, bias, pos_embed, cls_token, reg_token, mean, std, no_embed_class):
    return patch_embed.patch_embed(
        x, weight, bias, pos_embed, cls_token, reg_token, no_embed_class=no_embed_class, mean=mean, std=std
    )


def _preprocess_args(device):
    # two uint8 images of different sizes, packed as preprocess() packs them: bicubic 5x6, centre crop 4x5
    images = [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device=device) for h, w in ((6, 5), (4, 7))]
    batch = preprocess._pack_for_kernel(images, (5, 6), (4, 5), "bicubic")
    return [*batch, 4, 5, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], torch.float32, False]


def _preprocess_uint8_args(device):
    # PIL's uint8 passes: a 9x5 image resized height first (Pillow 13's order), a 4x7 one width first, one launch
    images = [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, device=device) for h, w in ((9, 5), (4, 7))]
    batch = preprocess._pack_for_kernel(images, (5, 6), (4, 5), "bicubic", uint8_passes=True)
    assert batch.images[:, 3].tolist() == [1, 0]
    return [*batch, 4, 5, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], torch.float32, True]


def _attention_public(qkv, num_heads, scale, lengths, cu_seqlens, max_seqlen):
    return attention.attention(qkv, num_heads, scale, lengths=lengths, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


# id -> (op name, args builder (the op's arguments in its order), the public function on the same arguments)
CASES = {
    "patch_embed": ("patch_embed", _patch_embed_args, _patch_embed_public),
    "patch_embed-uint8": ("patch_embed", _patch_embed_uint8_args, _patch_embed_public),
    "attention": ("attention", lambda d: [_randn(d, 2, 5, 3 * 2 * 16), 2, 0.3], attention.attention),
    "attention-lengths": (
        "attention",
        lambda d: [_randn(d, 2, 5, 3 * 2 * 16), 2, 0.3, torch.tensor([5, 2], dtype=torch.int32, device=d), None, None],
        _attention_public,
    ),
    "attention-packed": (
        "attention",
        lambda d: [
            _randn(d, 2, 5, 3 * 2 * 16),
            2,
            0.3,
            None,
            torch.tensor([0, 3, 5, 9], dtype=torch.int32, device=d),
            4,
        ],
        _attention_public,
    ),
    "attention_pool": (
        "attention_pool",
        lambda d: [_randn(d, 1, 3, 2 * 16), _randn(d, 2, 5, 2 * 2 * 16), 2, 0.3],
        attention_pool.attention_pool,
    ),
    "diff_attention": (
        "diff_attention",
        lambda d: [
            _randn(d, 2, 5, 3 * 2 * 2 * 8),
            torch.randn((), device=d).requires_grad_(),
            _randn(d, 16),
            2,
            0.35,
            0.3,
            1e-5,
        ],
        diff_attention.diff_attention,
    ),
    "linear-gelu": (
        "linear",
        lambda d: [_randn(d, 2, 3, 7), _randn(d, 5, 7), _randn(d, 5), "gelu", None, None],
        linear.linear,
    ),
    "linear-residual-gamma": (
        "linear",
        lambda d: [_randn(d, 3, 7), _randn(d, 5, 7), None, "gelu_tanh", _randn(d, 3, 5), _randn(d, 5)],
        linear.linear,
    ),
    "layer_norm_linear": (
        "layer_norm_linear",
        lambda d: [_randn(d, 2, 3, 7), _randn(d, 7), _randn(d, 7), 1e-6, _randn(d, 5, 7), _randn(d, 5), "gelu"],
        linear.layer_norm_linear,
    ),
    "add_layer_norm": (
        "add_layer_norm",
        lambda d: [_randn(d, 2, 3, 9), _randn(d, 2, 3, 9), _randn(d, 9), _randn(d, 9), 1e-5],
        layer_norm.add_layer_norm,
    ),
    "layer_norm": ("layer_norm", lambda d: [_randn(d, 5, 9), _randn(d, 9), None, 1e-6], layer_norm.layer_norm),
    "rms_norm": ("rms_norm", lambda d: [_randn(d, 5, 9), _randn(d, 9), None, 1e-6], layer_norm.rms_norm),
    # the op takes the packed batch; preprocess.preprocess (a list of images) packs it on the host first
    "preprocess": ("preprocess", _preprocess_args, preprocess._preprocess),
    "preprocess-uint8": ("preprocess", _preprocess_uint8_args, preprocess._preprocess),
    "rms_norm_linear": (
        "rms_norm_linear",
        lambda d: [_randn(d, 2, 3, 7), _randn(d, 7), None, 1e-6, _randn(d, 5, 7), _randn(d, 5), "silu"],
        linear.rms_norm_linear,
    ),
}


def _op(name: str):
    return getattr(torch.ops.vit_fast, name).default


@pytest.mark.parametrize("check", OPCHECKS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_opcheck(case, check, device):
    name, make_args, _ = case
    torch.library.opcheck(_op(name), make_args(device), test_utils=check)


def test_every_op_has_a_case():
    """A new op in the vit_fast namespace must get a case above."""
    ops = {
        n for n in dir(torch.ops.vit_fast) if isinstance(getattr(torch.ops.vit_fast, n), torch._ops.OpOverloadPacket)
    }
    assert ops == {name for name, _, _ in CASES.values()}


def _half(t):
    return t.detach().half()


# id -> (case, argument index, replacement (device, valid args) -> bad argument, error type, message pattern)
BAD_INPUTS = {
    "patch_embed-pos-rows": ("patch_embed", 3, lambda d, a: a[3][:, 1:], ValueError, "pos_embed has 8 rows"),
    "patch_embed-weight-dtype": ("patch_embed", 1, lambda d, a: _half(a[1]), TypeError, "x has dtype torch.float32"),
    "patch_embed-uint8-mean-shape": ("patch_embed-uint8", 6, lambda d, a: a[6][:2], ValueError, "mean has shape"),
    "attention-head-dim-8": ("attention", 0, lambda d, a: _randn(d, 2, 5, 48), ValueError, "head_dim 8"),
    "attention-float64": ("attention", 0, lambda d, a: a[0].detach().double(), TypeError, "float64 is not supported"),
    "attention-lengths-dtype": ("attention-lengths", 3, lambda d, a: a[3].long(), ValueError, "lengths must be int32"),
    "attention-lengths-shape": ("attention-lengths", 3, lambda d, a: a[3][:1], ValueError, r"shape \[B\] = \[2\]"),
    "attention-packed-both": ("attention-packed", 3, lambda d, a: a[4][:2], ValueError, "not both"),
    "attention_pool-q-batch": ("attention_pool", 0, lambda d, a: _randn(d, 3, 3, 32), ValueError, "q has batch 3"),
    "attention_pool-q-dtype": ("attention_pool", 0, lambda d, a: _half(a[0]), TypeError, "cast q to kv's dtype"),
    "diff_attention-weight": ("diff_attention", 2, lambda d, a: a[2][:8], ValueError, r"shape \(16,\), got \(8,\)"),
    "linear-weight-transposed": ("linear-gelu", 1, lambda d, a: a[1].t(), ValueError, "in_features 5"),
    "linear-residual-shape": ("linear-residual-gamma", 4, lambda d, a: a[4][:, :4], ValueError, "residual must"),
    "linear-bias-dtype": ("linear-gelu", 2, lambda d, a: _half(a[2]), TypeError, "dtypes differ"),
    "layer_norm_linear-ln-shape": ("layer_norm_linear", 1, lambda d, a: a[1][:6], ValueError, "ln_weight must"),
    "layer_norm_linear-eps": ("layer_norm_linear", 3, lambda d, a: -1.0, ValueError, "eps must be a positive"),
    "add_layer_norm-residual-dtype": ("add_layer_norm", 1, lambda d, a: _half(a[1]), TypeError, "residual has dtype"),
    "add_layer_norm-weight-shape": ("add_layer_norm", 2, lambda d, a: a[2][:8], ValueError, "weight has shape"),
    "layer_norm-eps": ("layer_norm", 3, lambda d, a: 0.0, ValueError, "eps must be a positive float"),
    "rms_norm-weight-shape": ("rms_norm", 1, lambda d, a: a[1][:8], ValueError, "weight has shape"),
    "rms_norm_linear-eps": ("rms_norm_linear", 3, lambda d, a: 0.0, ValueError, "rms_norm_linear: eps must be"),
    "preprocess-weight-dtype": ("preprocess", 4, lambda d, a: a[4].double(), ValueError, "row_weight must be"),
}


@pytest.mark.parametrize("bad", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_fake_refuses_what_the_op_refuses(bad, device):
    """Traced (torch.compile, export) the fake runs instead of the launcher: it must raise the same error."""
    case, index, replace, error, match = bad
    name, make_args, public = CASES[case]
    args = make_args(device)
    args[index] = replace(device, args)
    with pytest.raises(error, match=match) as eager:
        public(*args)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(error) as traced:
            _op(name)(*fake_args)
    assert str(traced.value) == str(eager.value)


# ---------------------------------------------------------------------------------- direct launch or custom op
def _linear_call(device, grad: bool):
    x = torch.randn(3, 5, 7, device=device)
    weight = torch.nn.Parameter(torch.randn(6, 7, device=device), requires_grad=grad)
    return lambda: linear.linear(x, weight, None, "gelu")


def _pool_call(device, grad: bool):  # timm's latent query is a Parameter; kv, the activation, decides
    q = torch.nn.Parameter(torch.randn(1, 1, 32, device=device), requires_grad=grad)
    kv = torch.randn(2, 5, 64, device=device)
    return lambda: attention_pool.attention_pool(q, kv, 2)


def _forward_call(device, grad: bool):
    from ..fakes import tiny_model

    model = tiny_model(seed=3, img_size=16, patch_size=8, embed_dim=32, num_heads=2, depth=1).to(device)
    model.requires_grad_(grad).set_backend("triton")
    x = torch.randn(1, 3, 16, 16, device=device)
    return lambda: model.forward_features(x)


#: mode -> (how the call runs, whether its parameters need a gradient, whether it goes through the op)
LAUNCH_MODES = {
    "no_grad": (torch.no_grad, True, False),
    "inference_mode": (torch.inference_mode, True, False),
    "grad-on-parameters-frozen": (torch.enable_grad, False, False),
    "grad-on": (torch.enable_grad, True, True),
}


@pytest.mark.parametrize("mode", LAUNCH_MODES, ids=LAUNCH_MODES.keys())
@pytest.mark.parametrize("make", [_linear_call, _pool_call, _forward_call], ids=["linear", "pool", "forward"])
def test_direct_launch_or_custom_op(make, mode, device):
    """The one choice (``kernels._launch.define_op``'s call): plain eager with nothing that needs a gradient launches
    directly, with no ``vit_fast::`` op dispatched; autograd on a parameter that needs one goes through the op. The
    same for a public op and a model's forward (``triton_path.ops_for`` leaves the choice to each call)."""
    from torch.profiler import profile

    context, grad, through_op = LAUNCH_MODES[mode]
    call = make(device, grad)
    with context(), profile() as prof:
        out = call()
    dispatched = {e.name for e in prof.events() if e.name.startswith("vit_fast::")}
    assert bool(dispatched) == through_op, dispatched
    assert out.requires_grad == through_op


@pytest.mark.parametrize("make", [_linear_call, _forward_call], ids=["linear", "forward"])
def test_compiled_calls_go_through_the_op(make, device):
    """Traced by torch.compile, each call is the op (its fake runs while tracing): the graph holds it."""
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    call = make(device, False)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = call()
        compiled = torch.compile(call, backend=backend, fullgraph=True)()
    assert any(t.startswith("vit_fast.") for t in targets), targets
    torch.testing.assert_close(compiled, eager)
