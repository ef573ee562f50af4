"""The right backend and dtype for the card (issue 19, item 2), with the card faked: ``backend="auto"`` runs
our kernels only where tl.dot has tensor cores (sm_80 and up) and says why naming the card; bf16 is refused
where the card emulates it; bench and demo default to a dtype the card runs natively; ``vit-fast info``
reports each card and writes --json.

No CUDA tensor can exist here, so the choice is asked of ``torch.device("cuda:N")`` with the card faked
(``cards.pretend_arch`` or a patched ``torch.cuda.get_device_capability``) and CUDA availability faked the
way ``benchmarks/host_overhead.py`` does (``vit_fast.backend.runtime.cuda_available``). Forward-time checks run on
CPU tensors under ``pretend_arch``, where the CPU reads as the pretended card.
"""

from __future__ import annotations

import json
import types
import warnings

import pytest
import torch

import vit_fast.model.vit as model_module
from vit_fast import demo
from vit_fast.backend import runtime
from vit_fast.base import cards
from vit_fast.bench import harness as bench_harness
from vit_fast.bench import settings as bench_settings
from vit_fast.cli import main
from vit_fast.util import dtypes

from ..fakes import tiny_model


def auto_model(**overrides):
    return tiny_model(**overrides).set_backend("auto")


TENSOR_CORE_ARCHS = (80, 86, 89, 90, 100, 120)
NAMES = {75: "Tesla T4", 80: "NVIDIA A100-SXM4-40GB", 90: "NVIDIA H100 80GB HBM3"}


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA reads as available and every device has a name; the card comes from pretend_arch or a test's own
    get_device_capability."""
    monkeypatch.setattr(runtime, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(model_module, "_WARNED", set())


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine with a T4 (cuda:0) and an H100 (cuda:1), as torch would describe them."""
    caps = {0: (7, 5), 1: (9, 0)}
    names = {0: NAMES[75], 1: NAMES[90]}

    def index_of(device=None):
        return device.index if isinstance(device, torch.device) else (device or 0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: caps[index_of(device)])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: names[index_of(device)])
    props = {
        i: types.SimpleNamespace(name=names[i], major=caps[i][0], minor=caps[i][1], total_memory=16 * 2**30)
        for i in caps
    }
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props[index_of(device)])
    cards._cuda_arch.cache_clear()
    yield
    cards._cuda_arch.cache_clear()


# --------------------------------------------------------------------------- backend="auto"
def test_auto_picks_torch_on_sm75_and_names_the_card(fake_cuda):
    model = auto_model()
    with cards.pretend_arch(75):
        assert model.resolved_backend(torch.device("cuda:0")) == "torch"
        choice = model.explain_backend(torch.device("cuda:0"))
    assert choice.backend == "torch"
    assert "Tesla T4 (cuda:0, sm_75)" in choice.reason and "no tensor cores" in choice.reason
    assert str(choice).startswith("torch: Tesla T4")


@pytest.mark.parametrize("arch", TENSOR_CORE_ARCHS)
def test_auto_picks_triton_where_tl_dot_has_tensor_cores(fake_cuda, arch):
    model = auto_model()
    with cards.pretend_arch(arch):
        assert model.resolved_backend(torch.device("cuda:0")) == "triton"
        assert runtime.auto_backend("cuda:0") == "triton"
        choice = model.explain_backend("cuda:0")
    assert choice.backend == "triton"
    assert f"(cuda:0, sm_{arch})" in choice.reason and "tensor cores" in choice.reason
    assert cards.card_for_arch(arch).dot in choice.reason


def test_auto_reads_each_devices_own_card(two_gpus):
    """cuda:0 is a T4, cuda:1 an H100: the choice follows the device asked about, not the current one."""
    model = auto_model()
    assert model.resolved_backend(torch.device("cuda:0")) == "torch"
    assert model.resolved_backend(torch.device("cuda:1")) == "triton"
    assert "NVIDIA H100 80GB HBM3 (cuda:1, sm_90)" in model.explain_backend("cuda:1").reason


def test_auto_on_cpu_picks_torch_and_says_why():
    model = auto_model()
    x = torch.randn(1, 3, 32, 32)
    assert model.resolved_backend(x) == "torch"
    assert model.explain_backend(x).backend == "torch"
    assert model.backend_reason.startswith("torch: cpu is not a CUDA device")


def test_auto_keeps_torch_for_a_head_dim_the_kernels_do_not_take(fake_cuda):
    model = auto_model(embed_dim=48, num_heads=4)  # head dim 12
    with cards.pretend_arch(90):
        assert model.resolved_backend(torch.device("cuda:0")) == "torch"
        assert "head dim 12" in model.explain_backend("cuda:0").reason


def test_explicit_backends_are_kept_and_explained(fake_cuda):
    model = tiny_model().set_backend("torch")
    with cards.pretend_arch(90):
        assert model.resolved_backend(torch.device("cuda:0")) == "torch"
        assert "backend='torch'" in model.backend_reason
        model.set_backend("triton")
        assert model.resolved_backend(torch.device("cuda:0")) == "triton"
    with cards.pretend_arch(75):  # the user asked: it runs there, and the reason says what it costs
        choice = model.explain_backend("cuda:0")
    assert choice.backend == "triton" and "Tesla T4 (cuda:0, sm_75)" in choice.reason and "slower" in choice.reason


def test_patched_timm_blocks_follow_the_same_rule(fake_cuda):
    from vit_fast.interop.forwards import kernels_can_run as _kernels_can_run

    class OnCuda:  # all _kernels_can_run reads of its input: its device and dtype
        device = torch.device("cuda:0")
        dtype = torch.float16

    with cards.pretend_arch(75):
        assert not _kernels_can_run(OnCuda(), "auto")
        assert _kernels_can_run(OnCuda(), "triton")
    with cards.pretend_arch(80):
        assert _kernels_can_run(OnCuda(), "auto")


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_patched_models_take_the_kernels_dtypes_only(fake_cuda, backend):
    """One rule for timm's and transformers' patched blocks (runtime.patched_runs_kernels): float64 keeps the
    model's own forward on any card; bf16 on a card that emulates it is refused as VisionTransformer refuses it
    (backend "auto" never reaches the kernels there: a T4 has no tensor cores for tl.dot)."""

    class OnCuda:  # what the rule reads of its input: its device and dtype
        device = torch.device("cuda:0")

        def __init__(self, dtype):
            self.dtype = dtype

    with cards.pretend_arch(90):
        assert not runtime.patched_runs_kernels(OnCuda(torch.float64), backend)
        assert all(runtime.patched_runs_kernels(OnCuda(d), backend) for d in (torch.float16, torch.bfloat16))
    with cards.pretend_arch(75):
        assert not runtime.patched_runs_kernels(OnCuda(torch.float64), backend)
        if backend == "auto":
            assert not runtime.patched_runs_kernels(OnCuda(torch.bfloat16), backend)
        else:
            with pytest.raises(ValueError, match=r"bf16 is not native on Tesla T4 .*backend='auto'"):
                runtime.patched_runs_kernels(OnCuda(torch.bfloat16), backend)
            assert runtime.patched_runs_kernels(OnCuda(torch.float16), backend)


def test_explicit_triton_without_tensor_cores_runs_and_warns_once(fake_cuda):
    """On a CPU under the interpreter, pretending sm_75: the forward runs our kernels, with one warning."""
    model = tiny_model().set_backend("triton")
    x = torch.randn(1, 3, 32, 32)
    with cards.pretend_arch(75), warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        first = model(x)
        second = model(x)
    said = [w for w in caught if "no tensor cores" in str(w.message)]
    assert len(said) == 1 and "backend='torch'" in str(said[0].message)
    torch.testing.assert_close(first, second)
    assert torch.isfinite(first).all()


# --------------------------------------------------------------------------- bf16 where the card emulates it
def test_bf16_on_sm75_is_refused_naming_the_card_and_the_fix(fake_cuda):
    with cards.pretend_arch(75), pytest.raises(ValueError) as err:
        dtypes.check_dtype_on_device(torch.bfloat16, torch.device("cuda:0"), "use float16 or float32")
    assert "bf16 is not native on Tesla T4 (cuda:0, sm_75)" in str(err.value)
    assert str(err.value).endswith("use float16 or float32")
    with cards.pretend_arch(75):
        dtypes.check_dtype_on_device(torch.float16, "cuda:0", "unused")  # fp16 and fp32 are native there
        dtypes.check_dtype_on_device(torch.float32, "cuda:0", "unused")
    for arch in TENSOR_CORE_ARCHS:
        with cards.pretend_arch(arch):
            dtypes.check_dtype_on_device(torch.bfloat16, "cuda:0", "unused")


def test_is_bf16_supported_is_never_asked(fake_cuda, monkeypatch):
    """torch.cuda.is_bf16_supported() says True on sm_75 (emulation) and reads the current device."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: pytest.fail("is_bf16_supported asked"))
    with cards.pretend_arch(75):
        assert not dtypes.bf16_native("cuda:0")
        assert dtypes.native_dtype("cuda:0") == torch.float16
        with pytest.raises(bench_settings.BenchError, match="Tesla T4"):
            bench_settings.check_dtype_supported(torch.device("cuda:0"), "bf16")


def test_triton_path_refuses_bf16_before_any_compute(fake_cuda, monkeypatch):
    import vit_fast.model.stages as stages

    model = tiny_model().to(torch.bfloat16).set_backend("triton")
    monkeypatch.setattr(stages, "features_triton", lambda *a: pytest.fail("the kernels ran"))
    x = torch.randn(1, 3, 32, 32, dtype=torch.bfloat16)
    for call in (model, lambda x: list(model.forward_stages(x))):
        with cards.pretend_arch(75), pytest.raises(ValueError, match=r"bf16 is not native on .*float16 or float32"):
            call(x)


def test_torch_backend_runs_emulated_bf16_and_warns_once(fake_cuda):
    """Not refused (torch computes it right; the user chose the dtype); one warning naming the fix."""
    model = auto_model().to(torch.bfloat16)  # auto: torch on a CPU input
    x = torch.randn(1, 3, 32, 32, dtype=torch.bfloat16)
    with cards.pretend_arch(75), warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        model(x)
        model(x)
    said = [str(w.message) for w in caught if "emulated" in str(w.message)]
    assert len(said) == 1 and "float16" in said[0]
    with cards.pretend_arch(80), warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        model(x)
    assert not [w for w in caught if "emulated" in str(w.message)]


# --------------------------------------------------------------------------- bench and demo dtypes
@pytest.mark.parametrize("arch, expected", [(75, "fp16"), (80, "bf16"), (86, "bf16"), (90, "bf16"), (120, "bf16")])
def test_bench_defaults_to_a_dtype_the_card_runs_natively(fake_cuda, two_gpus, monkeypatch, arch, expected):
    checked = []
    monkeypatch.setattr(bench_harness, "check_dtype_supported", lambda device, name: checked.append(name))
    with cards.pretend_arch(arch):
        h = bench_harness.Harness(bench_settings.BenchSettings(model="vit_tiny_patch16_224", device="cuda:0"))
    assert h.dtypes == [expected] and checked == [expected]
    assert bench_settings.default_dtypes(torch.device("cpu")) == ["fp32"]


def test_bench_refuses_bf16_on_a_card_without_it_before_any_work(two_gpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_harness.Harness, "run", lambda self: pytest.fail("the benchmark started"))
    out = tmp_path / "out"
    rc = main(["bench", "vit_tiny_patch16_224", "--dtype", "bf16", "--device", "cuda:0", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "bf16 is not native on Tesla T4 (cuda:0, sm_75)" in err and "--dtype fp16 or fp32" in err
    assert not out.exists()


@pytest.mark.parametrize("arch, expected", [(75, torch.float16), (80, torch.bfloat16), (90, torch.bfloat16)])
def test_demo_times_vit_b16_in_the_cards_native_dtype(fake_cuda, monkeypatch, arch, expected):
    asked = []

    class Stop(Exception):
        pass

    class Model:
        def to(self, device, dtype):
            asked.append((device, dtype))
            raise Stop

    monkeypatch.setattr(demo.steps, "load_model", lambda *a, **k: Model())
    with cards.pretend_arch(arch), pytest.raises(Stop):
        demo.steps.vit_b16_step(0)
    assert asked == [(torch.device("cuda:0"), expected)]


# --------------------------------------------------------------------------- vit-fast info
def test_info_reports_each_card_and_the_auto_choice(two_gpus, tmp_path, capsys):
    path = tmp_path / "sub" / "info.json"
    assert main(["info", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "sm_75 (T4, RTX 20xx): 64 KB shared memory per block" in out
    assert "torch: Tesla T4 (cuda:0, sm_75) has no tensor cores" in out
    assert "triton: NVIDIA H100 80GB HBM3 (cuda:1, sm_90)" in out
    report = json.loads(path.read_text())
    assert report["vit_fast_version"]
    t4, h100 = report["gpus"]
    assert t4["card"] | {"summary": None} == {
        "arch": "sm_75",
        "row": "sm_75",
        "examples": "T4, RTX 20xx",
        "shared_memory_per_block_kb": 64,
        "tensor_cores": False,
        "tl_dot": "fma",
        "tma": False,
        "native_bf16": False,
        "summary": None,
    }
    assert (t4["auto_backend"], t4["default_dtype"]) == ("torch", "fp16")
    assert (h100["auto_backend"], h100["default_dtype"]) == ("triton", "bf16")
    assert h100["card"]["tma"] and h100["card"]["tensor_cores"] and h100["card"]["shared_memory_per_block_kb"] == 227
    assert "Tesla T4 (cuda:0, sm_75)" in t4["auto_reason"]
    assert main(["info", "--json", str(path)]) == 0  # its own file: replaced


def test_info_on_cpu_says_there_is_no_gpu_and_auto_picks_torch(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "info.json"
    assert main(["info", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gpu: none visible to torch" in out and "auto         torch (no GPU here)" in out
    report = json.loads(path.read_text())
    assert report["gpus"] == [] and report["cpu"]["auto_backend"] == "torch"
    assert report["cpu"]["default_dtype"] == "fp32"


def _launcher_machine(monkeypatch, tmp_path):
    """A made-up machine for what Triton's launcher needs: a C compiler (CC, a script that answers --version),
    no Python.h in the include folder, libcuda.so.1 where TRITON_LIBCUDA_PATH points."""
    from vit_fast.backend import env

    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'fakecc 1.0'\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    (tmp_path / "include").mkdir()
    monkeypatch.setattr(env, "python_include_dir", lambda: str(tmp_path / "include"))
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "libcuda.so.1").write_text("")
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path / "driver"))


def _launcher_lines(out):
    lines = out.split("triton's C launcher, built on a GPU the first time each kernel runs, needs:\n")[1].splitlines()
    return {line[2:17].strip(): line[17:] for line in lines[:3]}


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "gpu"])
def test_info_reports_what_tritons_launcher_needs(two_gpus, monkeypatch, tmp_path, capsys, cuda):
    """The C compiler, Python.h and libcuda, as doctor checks them (vit_fast.backend.env.launcher_needs): a missing one
    is a failure with the fix where kernels compile, a warning on a CPU; --json carries the same."""
    _launcher_machine(monkeypatch, tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    path = tmp_path / "info.json"
    assert main(["info", "--json", str(path)]) == 0
    lines = _launcher_lines(capsys.readouterr().out)
    assert lines["C compiler"] == f"{tmp_path / 'cc'} (CC={tmp_path / 'cc'}: fakecc 1.0)"
    assert lines["libcuda"].startswith(f"{tmp_path / 'driver' / 'libcuda.so.1'} (TRITON_LIBCUDA_PATH=")
    headers = lines["Python headers"]
    assert headers.startswith(("failed: " if cuda else "warning: ") + f"no Python.h in {tmp_path / 'include'}")
    assert "-dev" in headers and ("not needed on this CPU" in headers) is not cuda
    launcher = {need["name"]: need for need in json.loads(path.read_text())["triton_launcher"]}
    assert [launcher[name]["status"] for name in ("C compiler", "Python headers", "libcuda")] == [
        "ok",
        "failed" if cuda else "warning",
        "ok",
    ]
    assert launcher["libcuda"]["path"] == str(tmp_path / "driver" / "libcuda.so.1")
    assert launcher["Python headers"]["summary"] in headers


def test_info_on_cpu_says_libcuda_is_not_needed_there(monkeypatch, tmp_path, capsys):
    _launcher_machine(monkeypatch, tmp_path)
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path / "include"))  # a folder without libcuda.so.1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["info"]) == 0
    libcuda = _launcher_lines(capsys.readouterr().out)["libcuda"]
    assert libcuda.startswith(f"TRITON_LIBCUDA_PATH={tmp_path / 'include'} is set, but that folder holds no libcuda")
    assert libcuda.endswith("(not needed on this CPU: the interpreter compiles nothing)")


def test_info_refuses_to_replace_a_file_it_did_not_write(tmp_path, capsys):
    path = tmp_path / "notes.json"
    path.write_text('{"mine": true}\n')
    assert main(["info", "--json", str(path)]) == 1
    assert "was not written by vit-fast" in capsys.readouterr().err
    assert path.read_text() == '{"mine": true}\n'
    assert main(["info", "--json", str(path), "--overwrite"]) == 0
    assert json.loads(path.read_text())["vit_fast_version"]


def test_a_float64_model_never_reaches_the_kernels(fake_cuda, monkeypatch):
    """The fast path launches the kernels unchecked: a float64 model on "auto" keeps the torch path on a card where
    "auto" picks triton (same numbers as torch), and an explicit backend="triton" is refused before any compute."""
    import vit_fast.model.stages as stages

    monkeypatch.setattr(stages, "features_triton", lambda *a: pytest.fail("the kernels ran"))
    monkeypatch.setattr(runtime, "auto_backend", lambda device, head_dim=None: "triton")  # a card with tensor cores
    model = tiny_model().double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert model.backend_for_call(x) == "torch"
        torch.testing.assert_close(model(x), model.set_backend("torch")(x), rtol=0, atol=0)
        model.set_backend("triton")
        for call in (model, lambda x: list(model.forward_stages(x))):
            with cards.pretend_arch(90), pytest.raises(ValueError, match=r"float16, bfloat16, float32.*float64"):
                call(x)
    model.float()
    assert model.backend_for_call(x.float()) == "triton"  # fp32 still goes to the kernels
