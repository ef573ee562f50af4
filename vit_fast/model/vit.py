"""The Vision Transformer module, with timm's parameter names (``patch_embed.proj``, ``blocks.N.attn.qkv``,
``ls1.gamma``, ...), so a timm ``state_dict`` loads as it is. The ``"torch"`` backend is plain PyTorch (the
reference, and the path export traces); the ``"triton"`` backend runs the same parameters through our kernels. Both
run one plan of stages (:mod:`vit_fast.model.stages`) with their own ops.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from vit_fast.backend import runtime
from vit_fast.backend.pos_embed import resample_pos_embed
from vit_fast.base import cards
from vit_fast.model import packing, stages
from vit_fast.model.config import ViTConfig
from vit_fast.model.layers import TORCH_FUNCTIONAL, TORCH_MODULES, Block, PatchEmbed, skip_identity
from vit_fast.model.packing import PackedLayout, PackedOps
from vit_fast.model.timm_api import TimmModelAPI
from vit_fast.model.validation import check_model_input, finite_check, finite_check_from_env, require_finite
from vit_fast.util.dtypes import bf16_native, check_dtype_on_device
from vit_fast.util.limits import check_model_fits

if TYPE_CHECKING:
    from vit_fast.backend.runtime import BackendChoice
    from vit_fast.model.warmup import WarmupReport

BACKENDS = ("auto", "torch", "triton")


class VisionTransformer(TimmModelAPI, nn.Module):
    """A ViT that computes what timm's ``VisionTransformer`` computes for the same config. ``model(x)``: images
    ``[B, C, H, W]`` in the weights' dtype and device -> logits ``[B, num_classes]`` (pooled features ``[B, embed_dim]``
    when ``num_classes == 0``); :meth:`forward_features`: all tokens ``[B, T, embed_dim]`` after the final norm. A list
    of images of different sizes runs in one call (:meth:`forward_packed`). ``backend``: ``"torch"``, ``"triton"`` or
    ``"auto"``, chosen in this class only (:meth:`explain_backend`; docs/usage.md, "Which backend runs")."""

    def __init__(self, cfg: ViTConfig | str, backend: str = "auto") -> None:
        super().__init__()
        if isinstance(cfg, str):
            cfg = ViTConfig.from_name(cfg)
        elif isinstance(cfg, dict):
            raise TypeError(
                "VisionTransformer takes a ViTConfig or a preset name, got a dict: pass ViTConfig(**d) "
                "(or ViTConfig.from_dict(d))"
            )
        elif not isinstance(cfg, ViTConfig):
            raise TypeError(
                f"VisionTransformer takes a ViTConfig or a preset name (see vit_fast.PRESETS), got {type(cfg).__name__}"
            )
        if torch.get_default_device().type == "cpu":  # a meta build allocates nothing: its caller checks the weights
            check_model_fits(cfg, "ViTConfig", torch.get_default_dtype().itemsize)
        self.cfg = cfg
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim)) if cfg.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, cfg.embed_dim)) if cfg.reg_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.pos_embed_len, cfg.embed_dim))
        self.norm_pre = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps) if cfg.pre_norm else nn.Identity()
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.depth)])
        self.norm = nn.Identity() if cfg.use_fc_norm else nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps)
        self.fc_norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.layer_norm_eps) if cfg.use_fc_norm else nn.Identity()
        self.head = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.backend = "auto"
        #: where the weights came from (recorded by reports and artifacts); see :meth:`describe_weights`
        self.weights_source: dict = {"kind": "random", "seed": None}
        #: opt-in: name the first stage that goes non-finite (also ``VIT_FAST_CHECK_FINITE=1``)
        self.check_finite = False
        #: triton backend: LayerNorm folded into the GEMM after it (5 launches per block); False runs LN1 / LN2 as
        #: launches of their own (7 per block), to compare the two (also ``VIT_FAST_FUSE_LN=0``)
        self.fuse_layer_norm = True
        #: triton backend: forwards time the kernels' autotune candidates for shapes not seen before (inside
        #: ``kernels.autotune.tuning()``), as the warm-up tuned them; set by ``warmup(..., tune=True)``
        self.autotune = False
        # set_input_normalization: uint8 images accepted (buffers follow .to(); not in the state_dict)
        self.register_buffer("input_mean", None, persistent=False)
        self.register_buffer("input_std", None, persistent=False)
        self.set_backend(backend)
        self.init_weights()

    # ------------------------------------------------------------------ set-up
    def init_weights(self, seed: int | None = None) -> None:
        """timm-like initialisation: normal (std 0.02, clipped at +-2 as timm's truncated normal)
        weights, zero biases, unit norm scales; ``seed`` makes it reproducible."""
        if self.pos_embed.is_meta:
            return
        self.weights_source = {"kind": "random", "seed": seed}
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".gamma"):
                    p.fill_(self.cfg.init_values)
                elif p.ndim == 1 and ("norm" in name) and name.endswith(".weight"):
                    p.fill_(1.0)
                elif p.ndim == 1:
                    p.zero_()
                else:
                    p.copy_((torch.randn(p.shape, generator=gen) * 0.02).clamp_(-2.0, 2.0))

    def describe_weights(self) -> str:
        """One line for reports: ``random (seed 0)``, ``w.safetensors sha256:1a2b3c4d5e6f`` ..."""
        src = self.weights_source
        kind = src.get("kind")
        if kind == "random":
            seed = src.get("seed")
            return "random (unseeded)" if seed is None else f"random (seed {seed})"
        if kind == "file":
            return f"{src.get('file')} sha256:{str(src.get('sha256'))[:12]}"
        files = src.get("files")  # a Hugging Face folder: each weight file's hash
        hashes = f" ({', '.join(f'{n} sha256:{h[:12]}' for n, h in files.items())})" if files else ""
        return f"{kind}: {src.get('name', '?')}{hashes}"

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # noqa: D102
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        if self.weights_source.get("kind") == "random":
            self.weights_source = {"kind": "state_dict", "name": "loaded with load_state_dict"}
        return result

    # ------------------------------------------------------------------ timm's classifier API
    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head as timm does (``num_classes=0``: pooled features); the new head is randomly initialised."""
        changes = {"num_classes": num_classes}
        if global_pool is not None:
            changes["global_pool"] = global_pool
        cfg = self.cfg.replace(**changes)
        if cfg.use_fc_norm != self.cfg.use_fc_norm:
            raise ValueError(
                f"reset_classifier(global_pool={global_pool!r}) would change where the final norm sits "
                "(fc_norm); build a new model with that config instead"
            )
        self.cfg = cfg
        ref = self.pos_embed
        if num_classes:
            head = nn.Linear(cfg.embed_dim, num_classes, device=ref.device, dtype=ref.dtype)
            with torch.no_grad():
                head.weight.normal_(0.0, 0.02)
                head.bias.zero_()
            self.head = head
        else:
            self.head = nn.Identity()

    def set_backend(self, backend: str) -> VisionTransformer:
        """Choose ``"torch"``, ``"triton"`` or ``"auto"`` for every later call; returns self."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "triton":
            runtime.require_triton()
            if not runtime.head_dim_supported(self.cfg.head_dim):
                low, high = runtime.head_dim_range()
                raise ValueError(
                    f"the triton backend's attention takes head dims {low}..{high}, this model's is "
                    f"{self.cfg.head_dim} (embed_dim {self.cfg.embed_dim} / {self.cfg.num_heads} heads): "
                    "use backend='torch'"
                )
        self.backend = backend
        return self

    def resolved_backend(self, x: torch.Tensor | torch.device | str) -> str:
        """The backend a call with input ``x`` (or any input on device ``x``) runs on.

        ``"auto"``: our kernels on a CUDA card whose ``tl.dot`` runs on tensor cores (sm_80 and up), with triton
        installed and a head dim our attention takes; the torch backend everywhere else (CPU, sm_75 such as the T4). The
        rule is ``vit_fast.backend.runtime``'s, for the input's device."""
        if self.backend != "auto":
            return self.backend
        device = x.device if isinstance(x, torch.Tensor) else x
        return runtime.auto_backend(device, self.cfg.head_dim)

    def explain_backend(self, x: torch.Tensor | torch.device | str | None = None) -> BackendChoice:
        """Which backend a call with input ``x`` (a tensor or a device; default: the weights' device) runs on, and
        why, naming the card: ``str(model.explain_backend("cuda:0"))`` reads e.g. ``"torch: Tesla T4 (cuda:0,
        sm_75) has no tensor cores for Triton's tl.dot ..."``."""
        device = self.device if x is None else x.device if isinstance(x, torch.Tensor) else torch.device(x)
        return runtime.choose_backend(device, self.cfg.head_dim, asked=self.backend)

    @property
    def backend_reason(self) -> str:
        """:meth:`explain_backend` for the weights' device, as one line: ``"triton: NVIDIA A100 ... "``."""
        return str(self.explain_backend())

    def backend_for_call(self, x: torch.Tensor) -> str:
        """:meth:`resolved_backend` for ``x``, after the checks the card asks for, before any compute.

        Runs on every forward, so the card is read at most once here: for an explicit ``backend="triton"``
        or bf16 weights (``"auto"`` picked triton only after reading a card with tensor cores)."""
        backend = self.resolved_backend(x)
        if backend == "triton":
            from vit_fast.kernels.launches import SUPPORTED_DTYPES  # triton is needed now: the kernels run next

            if self.dtype not in SUPPORTED_DTYPES:
                # the fast path launches unchecked: a float64 model would reach the kernels (tl.dot in fp64)
                if self.backend == "auto":
                    return "torch"
                names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
                raise ValueError(
                    f"the triton backend computes in {names}; this model's weights are "
                    f"{str(self.dtype).removeprefix('torch.')}: convert it (model.float()) or use backend='torch'"
                )
        bf16 = self.dtype == torch.bfloat16
        if backend == "triton" and (bf16 or self.backend == "triton"):
            card = cards.card_of(x.device)
            if bf16 and not card.native_bf16:
                # Refused on the triton path: bf16 on a card that emulates it (sm_75) has never been a path of our
                # kernels (tl.dot falls back to FMA there and spills); float16 or float32 runs natively.
                check_dtype_on_device(
                    torch.bfloat16,
                    x.device,
                    "use float16 or float32 (model.half() / model.float(), and the input in the same dtype), or "
                    "backend='torch'",
                )
            if not card.tensor_cores:
                _warn_without_tensor_cores(x.device)
        elif backend == "torch" and bf16 and not bf16_native(x.device):  # a CPU reads as native
            _warn_emulated_bf16(x.device)
        return backend

    @property
    def dtype(self) -> torch.dtype:
        return self.pos_embed.dtype

    @property
    def device(self) -> torch.device:
        return self.pos_embed.device

    # ------------------------------------------------------------------ checks
    def check_input(self, x: torch.Tensor) -> tuple[int, int]:
        """Raise a ValueError that says what is wrong with ``x`` and how to fix it.

        Returns the patch grid ``(H / p, W / p)``. Runs before any compute.
        """
        return check_model_input(self, x)

    # ------------------------------------------------------------------ forward
    def pos_embed_at(self, grid: tuple[int, int]) -> torch.Tensor:
        """The position embedding a forward at patch grid ``grid`` adds (resampled off the native grid)."""
        return stages.position_embedding(self, grid)

    # ------------------------------------------------------------------ raw images
    def set_input_normalization(
        self, mean: tuple[float, ...] | torch.Tensor | None, std: tuple[float, ...] | torch.Tensor | None
    ) -> VisionTransformer:
        """Accept raw uint8 images ``[B, C, H, W]`` (0..255) and normalise them inside the model:
        ``(x / 255 - mean[c]) / std[c]`` with ``mean``/``std`` per channel in 0..1 units (torchvision's
        convention, e.g. ImageNet's (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225)). The triton backend
        fuses this into the patch-embedding kernel, so the float image never exists. Float inputs are
        still taken as already normalised. ``None, None`` turns it off. Returns self."""
        if mean is None and std is None:
            self.input_mean = self.input_std = None
            return self
        stats = []
        for name, value in (("mean", mean), ("std", std)):
            t = torch.as_tensor(value, dtype=torch.float32).flatten() if value is not None else None
            if t is None or t.numel() != self.cfg.in_chans or not torch.isfinite(t).all():
                raise ValueError(
                    f"input normalisation {name} must be {self.cfg.in_chans} finite numbers (one per channel, "
                    f"0..1 units), got {value!r}"
                )
            stats.append(t)
        if (stats[1] <= 0).any():
            raise ValueError(f"input normalisation std must be > 0 per channel, got {std!r}")
        device = self.pos_embed.device if not self.pos_embed.is_meta else "cpu"
        self.register_buffer("input_mean", stats[0].to(device), persistent=False)
        self.register_buffer("input_std", stats[1].to(device), persistent=False)
        return self

    def forward_stages(self, x: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """``(stage, tokens [B, T, D])`` after the patch embedding, after each block, and after the final
        norm, on the model's backend: what Hugging Face's ``output_hidden_states`` and the finite check read."""
        grid = self.check_input(x)
        found: list[tuple[str, torch.Tensor]] = []
        stages.features(self.forward_plan(x), self, x, grid, on_stage=lambda *stage: found.append(stage))
        yield from found

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``[B, T, D]`` after the final norm (T = prefix tokens + patches)."""
        return self._features(x)

    def _features(self, x: torch.Tensor, first_token: bool = False) -> torch.Tensor:
        """:meth:`forward_features`; with ``first_token`` the torch backend may return token 0 alone
        (``[B, 1, D]``, see :func:`vit_fast.stages.eager_shortcuts`): what pooling on the class token reads."""
        on_stage = None
        if self.check_finite or finite_check_from_env():
            require_finite("input", x, None)
            on_stage, first_token = finite_check(), False
        grid = self.check_input(x)
        return stages.features(self.forward_plan(x, first_token), self, x, grid, on_stage)

    def forward_plan(
        self, x: torch.Tensor, first_token: bool = False, packed: tuple[tuple, PackedLayout] | None = None
    ) -> stages.ForwardPlan:
        """What a forward on the checked input ``x`` runs (backend, ops, fusion, tuning), resolved once per call shape
        and kept while nothing that decides it changes; ``packed``: a packed forward's ``(shapes, layout)``, ``x`` its
        first image. See docs/development.md, "The forward, planned once"."""
        if torch.compiler.is_compiling():  # a compiler traces the choice; nothing is kept from inside it
            return self._resolve_plan(x, first_token, packed)
        shape = x.shape if packed is None else packed[0]
        weights = self.dtype if x.dtype == torch.uint8 else None  # a checked float input has the weights' dtype
        key = (shape, x.dtype, x.device, weights, self.backend, self.autotune, self.fuse_layer_norm, first_token)
        plans = _PLANS.get(self)
        kept = None if plans is None else plans.get(key)
        if kept is not None and (kept[1] is None or kept[1] == kept[2](x)):
            return kept[0]
        plan = self._resolve_plan(x, first_token, packed)
        if plan.done is None:  # a forward that may clear the first-use net is planned again on its next call
            if plans is None or len(plans) >= _MAX_PLANS:
                plans = _PLANS[self] = {}
            read_state = None  # the torch backend's plan depends on nothing more than the key
            if plan.backend == "triton":
                from vit_fast.backend.triton_path import choice_state as read_state

            plans[key] = (plan, None if read_state is None else read_state(x), read_state)
        return plan

    def _resolve_plan(self, x: torch.Tensor, first_token: bool, packed) -> stages.ForwardPlan:
        """The plan :meth:`forward_plan` keeps: the backend for ``x``, then on the kernels the ops and fusion
        ``vit_fast.backend.triton_path`` picks (inside ``tuning()`` where the model tunes: the pick depends on it)."""
        backend = self.backend_for_call(x)
        if backend == "torch":
            if packed is None:
                return stages.ForwardPlan("torch", TORCH_FUNCTIONAL, first_token=first_token)
            # the module calls: hooks on a block's norms, GEMMs and activation see a packed forward
            return stages.ForwardPlan("torch", PackedOps(TORCH_MODULES, packed[1], x.device), packed=True)
        from vit_fast.backend import triton_path  # triton is needed now: the kernels run next

        tune = self.tuning_mode()
        shape = None if packed is None else packed[0]
        with stages.tuned(tune):
            ops = triton_path.ops_for(self, x, shape)
            fused = triton_path.layer_norm_fused(self)
        done = None if triton_path.settled(ops) else functools.partial(triton_path.forward_done, ops=ops, shape=shape)
        check_params = ops.params_checked  # the launches skip their own checks: the stages check every parameter once
        if packed is not None:
            ops = PackedOps(ops, packed[1], x.device)
        packed_ops = packed is not None
        return stages.ForwardPlan("triton", ops, fused, tune, packed=packed_ops, check_params=check_params, done=done)

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool ``[B, T, D]`` tokens (class token or average of patch tokens) and apply the head."""
        if self.cfg.global_pool == "avg":
            x = tokens[:, self.num_prefix_tokens :].mean(dim=1)
        else:
            x = tokens[:, 0]
        x = skip_identity(self.fc_norm, x)
        out = x if pre_logits else self.head(x)
        if self.check_finite or finite_check_from_env():
            require_finite("head", out, "final norm")
        return out

    def forward(self, x: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        if isinstance(x, (list, tuple)):  # images of different sizes: one packed forward
            return self.forward_packed(x)
        return self.forward_head(self._features(x, first_token=self.cfg.global_pool == "token"))

    # ------------------------------------------------------------------ packed: images of different sizes
    def forward_packed(self, images: Sequence[torch.Tensor], pre_logits: bool = False) -> torch.Tensor:
        """Logits ``[N, num_classes]`` (pooled features ``[N, D]`` with ``pre_logits`` or ``num_classes == 0``) of
        ``N`` images ``[C, H_i, W_i]`` of any sizes the model takes, in one forward: their tokens packed into one
        sequence, attention within each image (``vit_fast.model.packing``). Row ``i`` is what ``model(images[i][None])``
        computes. ``model(images)`` with a list or tuple comes here."""
        return packing.packed_forward(self, images, *self._packed_plan(images), pre_logits)

    def forward_features_packed(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's tokens ``[T_i, D]`` after the final norm (T_i = prefix tokens + its patches), from one packed
        forward of ``images`` (see :meth:`forward_packed`), in their order."""
        return packing.packed_features(self, images, *self._packed_plan(images))

    def _packed_plan(self, images: Sequence[torch.Tensor]) -> tuple[stages.ForwardPlan, PackedLayout]:
        """The plan and the layout of a packed forward of ``images``, after their checks."""
        layout = packing.layout_of(self, images, packing.check_images(self, images))
        shapes = ("packed", *(tuple(image.shape) for image in images))  # what the first-use net knows it by
        return self.forward_plan(images[0], packed=(shapes, layout)), layout

    # ------------------------------------------------------------------ warm start
    def warmup(
        self,
        batch_sizes: Sequence[int] | int,
        dtype: torch.dtype | str | None = None,
        tune: bool = False,
        verbose: bool = True,
    ) -> WarmupReport:
        """Compile the triton backend's kernels for ``batch_sizes`` now (one no-grad forward each, random images in
        ``dtype``: default uint8 for a model that normalises raw images, else the weights'; another float dtype is
        refused). ``tune=True`` times every candidate config (minutes on first use) and keeps the model tuned
        (:attr:`autotune`; docs/kernels.md, section "First use: compiling, and tuning on request"). Prints what it does
        (``verbose=False``: silent); the torch backend runs nothing. Returns a :class:`WarmupReport`."""
        from vit_fast.model.warmup import warmup_model

        return warmup_model(self, batch_sizes, dtype=dtype, tune=tune, verbose=verbose)

    def tuning_mode(self) -> bool | None:
        """Whether a forward times autotune candidates, read once for its plan: on where the model asked for tuning
        or it is on already (``VIT_FAST_AUTOTUNE``, an enclosing ``tuning()``); None when traced (a context
        variable set inside torch.compile's tracing would break the graph: each launch reads it then)."""
        from vit_fast.kernels.autotune import autotune_enabled

        if torch.compiler.is_compiling():
            return None
        return self.autotune or autotune_enabled()

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}, tokens={self.cfg.num_tokens}"


#: per model, its plans by call: ``key -> (plan, the kernels' state it was made in and how to read it, or None)``
#: (weak: no model is kept)
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MAX_PLANS = 64  # call shapes kept per model; one more starts the set afresh


#: (what, device) pairs already warned about in this process: each warning is said once, not on every forward
_WARNED: set[tuple[str, str]] = set()
_WARNED_LOCK = threading.Lock()


def _warn_once(what: str, device: torch.device, message: str) -> None:
    key = (what, str(device))
    with _WARNED_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(message, UserWarning, stacklevel=4)


def _warn_without_tensor_cores(device: torch.device) -> None:
    """Warn once per ``device`` (a card whose tl.dot has no tensor cores, sm_75) that backend='triton' was asked for
    explicitly; it still runs. Why: see docs/development.md, section "The backend, chosen once (`model/vit.py`)".
    """
    _warn_once(
        "no-tensor-cores",
        device,
        f"backend='triton' on {cards.device_name(device)}: this card has no tensor cores for Triton's tl.dot, so "
        "our kernels are expected to be slower than backend='torch' (cuBLAS) here; backend='auto' picks torch",
    )


def _warn_emulated_bf16(device: torch.device) -> None:
    """bf16 weights on the torch backend, on a card that emulates bf16 (sm_75): run, not refused, with a warning once
    per device. Why: see docs/development.md, section "The backend, chosen once (`model/vit.py`)".
    """
    _warn_once(
        "emulated-bf16",
        device,
        f"bf16 on {cards.device_name(device)} is emulated (no native bf16 on this card): the torch backend "
        "computes it correctly but slowly; float16 runs natively here (model.half() and the input in float16)",
    )


def count_flops(cfg: ViTConfig) -> int:
    """Multiply-add FLOPs (2 per MAC) of one image's forward at the native size."""
    T, D, P = cfg.num_tokens, cfg.embed_dim, cfg.num_patches
    patch = 2 * P * D * cfg.in_chans * cfg.patch_size**2
    attn_lin = 2 * T * D * 3 * D + 2 * T * D * D
    attn_core = 2 * 2 * T * T * D
    mlp = 2 * 2 * T * D * cfg.mlp_hidden_dim
    head = 2 * D * cfg.num_classes
    return patch + cfg.depth * (attn_lin + attn_core + mlp) + head


__all__ = ["VisionTransformer", "resample_pos_embed", "count_flops", "BACKENDS"]
