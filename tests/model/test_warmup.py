"""``model.warmup``: one no-grad forward per batch size on the triton backend, inside ``tuning()`` when asked,
with its arguments checked up front; and, with Triton's driver stubbed, what the default (untuned) warm-up
compiles: each kernel once per shape, with no timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_fast.kernels import KERNELS, autotune
from vit_fast.model import stages
from vit_fast.model.warmup import WarmupReport

from ..fakes import tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _default_tuning(monkeypatch):
    monkeypatch.delenv("VIT_FAST_AUTOTUNE", raising=False)


def _spy(monkeypatch, real: bool = False) -> list[tuple[int, torch.dtype, bool]]:
    """Record each triton forward as (batch, input dtype, tuning on); ``real``: run the kernels too."""
    calls = []
    run = stages.features_triton

    def features(model, x, grid, *plan_and_stage):
        calls.append((x.shape[0], x.dtype, autotune.autotune_enabled()))
        if real:
            return run(model, x, grid, *plan_and_stage)
        return torch.zeros(x.shape[0], model.cfg.num_tokens, model.cfg.embed_dim, dtype=model.dtype)

    monkeypatch.setattr(stages, "features_triton", features)
    return calls


def test_warmup_runs_one_forward_per_batch_size(monkeypatch, capsys):
    model = tiny_model(depth=1).set_backend("triton")
    calls = _spy(monkeypatch, real=True)  # the kernels run (interpreter): every shape really compiles
    report = model.warmup([3, 1])
    assert [(b, tuned) for b, _, tuned in calls] == [(1, False), (3, False)]
    assert isinstance(report, WarmupReport)
    assert (report.backend, report.tuned, report.dtype) == ("triton", False, torch.float32)
    assert sorted(report.seconds) == [1, 3] and report.total_s > 0
    assert report.compilations == 2 * 7  # patch embedding, 4 GEMMs, attention, the final norm; per batch size
    err = capsys.readouterr().err
    assert "compiling the Triton kernels for batch 1, 3 (fp32): up to 14 compilations" in err
    assert model.autotune is False


def test_tune_runs_inside_tuning_and_later_forwards_stay_tuned(monkeypatch, capsys):
    model = tiny_model().set_backend("triton")
    calls = _spy(monkeypatch)
    report = model.warmup([2, 1], tune=True)
    assert [(b, tuned) for b, _, tuned in calls] == [(1, True), (2, True)]
    assert report.tuned and model.autotune
    assert autotune.autotune_enabled() is False  # the caller's mode is left as it was
    assert "tuning the Triton kernels for batch 1, 2 (fp32)" in capsys.readouterr().err
    with torch.no_grad():
        model(torch.randn(4, 3, 32, 32))
    assert calls[-1] == (4, torch.float32, True)  # the tuned model's own forwards tune (and find) their shapes
    assert autotune.autotune_enabled() is False


def test_tuning_is_public_and_lazy():
    import vit_fast

    assert vit_fast.tuning is autotune.tuning and "tuning" in vit_fast.__all__
    with vit_fast.tuning():
        assert autotune.autotune_enabled()


def test_untuned_warmup_follows_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("VIT_FAST_AUTOTUNE", "1")
    model = tiny_model().set_backend("triton")
    calls = _spy(monkeypatch)
    report = model.warmup([1], verbose=False)
    assert calls[0][2] is True and report.tuned  # tune=False asks for nothing; the process setting still holds
    assert model.autotune is False
    assert capsys.readouterr().err == ""  # verbose=False: silent


def test_uint8_model_is_warmed_with_uint8_images(monkeypatch):
    model = tiny_model().set_input_normalization((0.5, 0.4, 0.3), (0.2, 0.2, 0.2)).set_backend("triton")
    calls = _spy(monkeypatch)
    assert model.warmup(1).dtype == torch.uint8
    assert model.warmup([1], dtype=torch.float32).dtype == torch.float32  # it takes float images too
    assert [d for _, d, _ in calls] == [torch.uint8, torch.float32]


def test_torch_backend_runs_nothing(monkeypatch, capsys):
    model = tiny_model()  # torch backend
    monkeypatch.setattr(model, "forward_features", lambda x: pytest.fail("warm-up ran a torch forward"))
    report = model.warmup([1, 64], tune=True)
    assert (report.backend, report.tuned, report.seconds) == ("torch", False, {})
    assert "nothing to compile: the model runs on the torch backend here (cpu input)" in capsys.readouterr().err
    assert model.autotune is False


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (([],), {}, ValueError, r"at least one batch size, e\.g\. model\.warmup\(\[1, 8, 64\]\)"),
        (([1, 0],), {}, ValueError, r"ints >= 1, got 0"),
        (([-4],), {}, ValueError, r"ints >= 1, got -4"),
        (([2.0],), {}, ValueError, r"ints >= 1, got 2\.0"),
        (([True],), {}, ValueError, r"ints >= 1, got True"),
        (("8",), {}, TypeError, r"list of batch sizes"),
        (([1],), {"dtype": torch.float16}, ValueError, r"weights are fp32.*model\.to\(torch\.float16\)"),
        (([1],), {"dtype": "bf16"}, ValueError, r"weights are fp32"),
        (([1],), {"dtype": torch.uint8}, ValueError, r"set_input_normalization"),
        (([1],), {"dtype": torch.int8}, ValueError, r"dtype must be one of fp32, fp16 or bf16"),
        (([1],), {"tune": "yes"}, TypeError, r"tune must be True or False"),
    ],
)
def test_warmup_checks_its_arguments_first(monkeypatch, args, kwargs, error, match):
    model = tiny_model().set_backend("triton")
    calls = _spy(monkeypatch)
    with pytest.raises(error, match=match):
        model.warmup(*args, **kwargs)
    assert calls == []


_STUB_SCRIPT = """
import collections, json, os, sys
sys.path.insert(0, "benchmarks")
import host_overhead
host_overhead.install_stub_driver()
os.environ.pop("VIT_FAST_AUTOTUNE")  # the stub sets "0"; the default is what is tested
import torch, triton
from triton.runtime import jit

tune = sys.argv[1] == "tune"
compiled, timed = [], []
stub_compile = jit.JITFunction._do_compile

def counting_compile(self, key, *args, **kwargs):
    compiled.append(self.fn.__name__)
    return stub_compile(self, key, *args, **kwargs)

def bench(fn, quantiles=None, **kwargs):
    if not tune:
        raise SystemExit("the default warm-up timed a config")
    timed.append(1)
    fn()  # the candidate compiles, as it would on a GPU
    return [1.0, 1.0, 1.0] if quantiles else 1.0

jit.JITFunction._do_compile = counting_compile
triton.runtime.driver.active.get_benchmarker = lambda: bench

from vit_fast import VisionTransformer
from vit_fast.kernels.autotune import autotune_enabled
from vit_fast.model.warmup import kernel_shapes

model = VisionTransformer("vit_base_patch16_224", backend="torch").eval().to(torch.float16).set_backend("triton")
out = {"shapes": kernel_shapes(model), "batches": {}}
for b in (1, 8):
    del compiled[:], timed[:]
    report = model.warmup([b], tune=tune, verbose=False)
    out["batches"][b] = {"compiled": dict(collections.Counter(compiled)), "timed": len(timed),
                         "announced": report.compilations, "tuned": report.tuned}
del compiled[:], timed[:]
with torch.no_grad():
    for b in (1, 8):  # real traffic after the warm-up: nothing left to compile or time
        model(torch.randn(b, 3, 224, 224, dtype=torch.float16))
out["after"] = {"compiled": len(compiled), "timed": len(timed), "tuning_left_on": autotune_enabled()}
print(json.dumps(out))
"""


def _stubbed_warmup(tmp_path, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "VIT_FAST_AUTOTUNE")}
    env.update(TRITON_CACHE_DIR=str(tmp_path / mode), TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run(
        [sys.executable, "-c", _STUB_SCRIPT, mode], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_default_warmup_compiles_each_kernel_once_per_shape_without_timing(tmp_path):
    """ViT-B/16 fp16 with Triton's driver stubbed and no VIT_FAST_AUTOTUNE: each batch size compiles each of its
    kernel shapes at most once (at most 8 compilations before the first output, the issue's bound), times nothing
    (the stub's benchmarker would exit), and the forwards after the warm-up compile nothing more."""
    out = _stubbed_warmup(tmp_path, "default")
    kernels = {KERNELS[k].kernel_name: n for k, n in out["shapes"].items() if n}
    for b, seen in out["batches"].items():
        assert not seen["tuned"] and seen["timed"] == 0, (b, seen)
        # one compilation per kernel and shape at most: proj and fc2 share theirs (K is not specialised on), and
        # batch 8 reuses batch 1's attention, patch embedding and LayerNorm (rows are a runtime argument)
        assert all(n <= kernels.get(k, 0) for k, n in seen["compiled"].items()), (b, seen)
        assert sum(seen["compiled"].values()) <= min(8, seen["announced"]), (b, seen)
    assert out["batches"]["1"]["compiled"].keys() == kernels.keys()  # a cold start compiles every kernel
    assert out["after"] == {"compiled": 0, "timed": 0, "tuning_left_on": False}


def test_tuned_warmup_times_candidates_and_later_forwards_reuse_them(tmp_path):
    out = _stubbed_warmup(tmp_path, "tune")
    for b, seen in out["batches"].items():
        assert seen["tuned"] and seen["timed"] > 0, (b, seen)
        assert sum(seen["compiled"].values()) <= seen["announced"], (b, seen)
    assert out["after"] == {"compiled": 0, "timed": 0, "tuning_left_on": False}
