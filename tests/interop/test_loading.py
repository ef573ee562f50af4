"""Weights from anywhere: every form load_model resolves, with the source recorded and no network
reached when a local file is given."""

from __future__ import annotations

import json
import socket
import time

import pytest
import torch

import vit_fast
from vit_fast.interop import loading

from ..fakes import tiny_hf_classifier


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a socket fails the test: local files must never reach for the hub."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_preset_means_random_weights_and_says_so(no_network):
    a = vit_fast.load_model("vit_tiny_patch16_224", backend="torch", seed=3)
    b = vit_fast.load_model("preset:vit_tiny_patch16_224", backend="torch", seed=3)
    assert a.describe_weights() == "random (seed 3)" and a.weights_source["preset"] == "vit_tiny_patch16_224"
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_default_records_the_file_and_its_hash(no_network):
    model = vit_fast.load_model("default", backend="torch")
    assert model.describe_weights().startswith("digits_vit.safetensors sha256:")
    assert len(model.weights_source["sha256"]) == 64


def _timm_like_state(cfg):
    torch.manual_seed(0)
    return {k: v.clone() for k, v in vit_fast.VisionTransformer(cfg, backend="torch").state_dict().items()}


def test_plain_state_dict_needs_a_config_and_takes_preset_or_json(tmp_path, no_network):
    from safetensors.torch import save_file

    cfg = vit_fast.ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=5)
    state = _timm_like_state(cfg)
    path = tmp_path / "timm_state.safetensors"
    save_file(state, str(path))
    with pytest.raises(ValueError, match=r"carries no vit-fast config .*command line: --config"):
        vit_fast.load_model(str(path))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    model = vit_fast.load_model(str(path), config=str(tmp_path / "config.json"), backend="torch")
    assert model.cfg == cfg and model.weights_source["layout"] == "timm"
    assert model.describe_weights().startswith("timm_state.safetensors sha256:")
    pth = tmp_path / "timm_state.pth"
    torch.save(state, pth)
    assert vit_fast.load_model(str(pth), config=cfg, backend="torch").cfg == cfg


def test_hf_state_dict_and_hf_config_json(tmp_path, no_network):
    from safetensors.torch import save_file

    hf = tiny_hf_classifier(num_labels=3, image_size=16)
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(tmp_path / "hf.safetensors"))
    hf.config.to_json_file(str(tmp_path / "config.json"))
    model = vit_fast.load_model(str(tmp_path / "hf.safetensors"), config=str(tmp_path / "config.json"), backend="torch")
    assert model.weights_source["layout"] == "hf" and model.cfg.num_classes == 3
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, rtol=1e-5, atol=1e-5)
    # the save_pretrained folder itself
    hf.save_pretrained(tmp_path / "folder")
    folder = vit_fast.load_model(str(tmp_path / "folder"), backend="torch")
    with torch.no_grad():
        torch.testing.assert_close(folder(x), hf(pixel_values=x).logits, rtol=1e-5, atol=1e-5)


def test_timm_name_with_tag_and_local_weights(tmp_path, no_network):
    timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it)")
    from safetensors.torch import save_file

    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    weights = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(weights))
    model = vit_fast.load_model("timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k", weights=weights, backend="torch")
    assert model.describe_weights().startswith("tiny.safetensors sha256:")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
    # a preset name with weights means timm's model of that name, not random weights
    again = vit_fast.load_model("vit_tiny_patch16_224", weights=weights, backend="torch")
    assert again.weights_source["kind"] == "file"
    with pytest.raises(FileNotFoundError, match=r"weights file .*missing.safetensors"):
        vit_fast.load_model("timm:vit_tiny_patch16_224.augreg_in21k", weights=tmp_path / "missing.safetensors")


def test_offline_hub_names_fail_in_seconds(monkeypatch):
    """Seconds, counted without a clock (a loaded machine stretches any wall time): the probe, every connection
    tried bounded by its timeout, no name looked up and no retry's sleep, their sum within the old 10 s bound."""
    monkeypatch.setattr(loading, "_HUB_PROBE_TIMEOUT_S", 2.0)
    probes, slept, lookups = [], [], []

    def no_lookup(host, *args, **kwargs):
        lookups.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "no network in this test")

    def unreachable(address, timeout=None, *args, **kwargs):
        probes.append(timeout)
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    monkeypatch.setattr(time, "sleep", slept.append)
    with pytest.raises(ValueError, match=r"cannot download Hugging Face model 'org/none-such': .*unreachable"):
        vit_fast.load_model("hf:org/none-such")
    assert 2.0 in probes and None not in probes and lookups == [], (probes, lookups)
    assert sum(probes) + sum(slept) < 10, (probes, slept)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", r"model name is empty"),
        ("vit_tiny_patch16_22", r"did you mean vit_tiny_patch16_224"),
        ("missing.safetensors", r"checkpoint 'missing.safetensors' does not exist"),
    ],
)
def test_bad_names_say_what_to_give(spec, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        vit_fast.load_model(spec)


# --------------------------------------------------------------------------- what a name or file may make vit-fast do
TINY = dict(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)


def test_a_name_that_is_not_a_string_says_what_it_got(tmp_path, no_network):
    with pytest.raises(TypeError, match=r"load_model takes a model name or path \(a str or os.PathLike\), got int 123"):
        vit_fast.load_model(123)
    with pytest.raises(TypeError, match=r"got NoneType None: give 'default'"):
        vit_fast.load_model(None)
    path = vit_fast.save_checkpoint(vit_fast.VisionTransformer(vit_fast.ViTConfig(**TINY)), tmp_path / "w.safetensors")
    assert vit_fast.load_model(path, backend="torch").cfg == vit_fast.ViTConfig(**TINY)  # a Path is a name too


def _plant(folder, marker, model_type="evil-vit"):
    folder.mkdir()
    config = {"model_type": model_type, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")


@pytest.mark.parametrize("model_type", ["evil-vit", "vit"])
def test_a_folder_with_its_own_code_is_refused_and_never_asked_about(tmp_path, monkeypatch, model_type, no_network):
    """transformers prompted `[y/N]` on a terminal and ran the folder's Python on "y"; the prompt is answered
    "y" here, and nothing may ask it or run the module."""
    import builtins

    pytest.importorskip("transformers", reason="transformers is not installed")
    asked = []
    monkeypatch.setattr(builtins, "input", lambda *a: asked.append(a) or "y")
    marker = tmp_path / "MARKER"
    _plant(tmp_path / "planted", marker, model_type)
    with pytest.raises(
        ValueError,
        match=r"Hugging Face folder '.*planted' names its own Python code in config.json's "
        r"auto_map \(AutoConfig: evil.EvilConfig, AutoModel: evil.EvilModel\).*trust_remote_code=False",
    ):
        vit_fast.load_model(str(tmp_path / "planted"))
    with pytest.raises(ValueError, match=r"names its own Python code"):
        vit_fast.load_model("hf:" + str(tmp_path / "planted"))
    assert asked == [] and not marker.exists()


def test_a_hub_model_with_its_own_code_is_refused_before_transformers_reads_it(monkeypatch, no_network):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")

    def config_dict(name, **kwargs):
        assert kwargs.get("local_files_only") is True  # the cache, as a downloaded model is found
        return {"model_type": "vit", "auto_map": {"AutoModel": "org/other--modeling.Evil"}}, {}

    def never(*args, **kwargs):
        raise AssertionError("transformers was asked to build the model")

    monkeypatch.setattr(transformers.PretrainedConfig, "get_config_dict", config_dict)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", never)
    with pytest.raises(ValueError, match=r"Hugging Face model 'org/evil' names its own Python code .*org/other--"):
        vit_fast.load_model("hf:org/evil")


def test_every_transformers_load_refuses_remote_code():
    """Each from_pretrained call in the product passes trust_remote_code=False (so transformers never prompts), and
    the only place that calls one refuses an auto_map first."""
    import ast
    from pathlib import Path

    root = Path(vit_fast.__file__).resolve().parent.parent
    calls = []
    for folder in ("vit_fast", "export", "tools", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                    keywords = {k.arg: k.value for k in node.keywords}
                    trusted = keywords.get("trust_remote_code")
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    assert isinstance(trusted, ast.Constant) and trusted.value is False, where
                    calls.append(where)
    assert calls and all(c.startswith("vit_fast/interop/loading.py") for c in calls), calls


def _fake_hub_cache(cache, repo: str, filename: str, payload: bytes) -> None:
    """A Hugging Face cache holding ``repo``'s ``filename`` at its main revision, as a download leaves it."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "snapshots" / commit / filename).write_bytes(payload)


def test_offline_timm_names_load_from_the_local_cache_without_any_socket(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 (set after huggingface_hub was imported, as a notebook would): a timm name's weights come
    from the local cache, and no connect or name lookup happens; a name that is not cached is refused."""
    timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it)")
    from huggingface_hub import constants
    from safetensors.torch import save

    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args[:2])
        raise OSError(101, "this test allows no network")

    for name in ("getaddrinfo", "create_connection"):
        monkeypatch.setattr(socket, name, refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    _fake_hub_cache(
        tmp_path / "hub", "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", "model.safetensors", save(state)
    )
    model = vit_fast.load_model("timm:vit_tiny_patch16_224", backend="torch")
    assert model.weights_source == {"kind": "timm", "name": "vit_tiny_patch16_224"}
    assert torch.equal(model.state_dict()["blocks.0.attn.qkv.weight"], state["blocks.0.attn.qkv.weight"])
    with pytest.raises(ValueError, match=r"'vit_tiny_patch16_224.augreg_in21k': HF_HUB_OFFLINE is set and they are "):
        vit_fast.load_model("timm:vit_tiny_patch16_224.augreg_in21k")
    assert attempts == [] and constants.HF_HUB_OFFLINE is False  # the switch passed on only while loading


@pytest.mark.parametrize("value, offline", [("1", True), ("TRUE", True), ("yes", True), ("0", False), ("false", False)])
def test_the_offline_switch_is_read_as_huggingface_hub_reads_it(monkeypatch, value, offline):
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert loading.hub_offline() is offline


def test_weights_load_as_they_are_or_are_refused(tmp_path, no_network):
    """One dtype throughout loads in that dtype (fp16, bf16); anything else is refused by tensor, never cast."""
    from safetensors.torch import save_file

    model = vit_fast.VisionTransformer(vit_fast.ViTConfig(**TINY), backend="torch")
    meta = {"vit_fast_config": json.dumps(model.cfg.to_dict())}
    for dtype in (torch.float16, torch.bfloat16):
        save_file({k: v.to(dtype) for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"), meta)
        loaded = vit_fast.load_model(str(tmp_path / "w.safetensors"), backend="torch")
        assert {p.dtype for p in loaded.state_dict().values()} == {dtype}
    with torch.no_grad():
        model.blocks[0].norm1.weight[3] = float("nan")
    vit_fast.save_checkpoint(model, tmp_path / "nan.safetensors")
    with pytest.raises(ValueError, match=r"'.*nan.safetensors': blocks.0.norm1.weight holds 1 NaN value\(s\) of 16"):
        vit_fast.load_model(str(tmp_path / "nan.safetensors"))


def test_models_converted_in_memory_follow_the_same_rules(no_network):
    timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it)")
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1).eval()
    with torch.no_grad():
        ref.blocks[0].attn.proj.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"timm VisionTransformer state_dict: blocks.0.attn.proj.weight holds 1 inf"):
        vit_fast.from_timm(ref)
    with torch.no_grad():
        ref.blocks[0].attn.proj.weight[0, 0] = 0.0
    ref.pos_embed.data = ref.pos_embed.data.half()
    with pytest.raises(ValueError, match=r"timm VisionTransformer state_dict mix dtypes: pos_embed is float16"):
        vit_fast.from_timm(ref)


def test_hf_weights_with_q_k_v_in_different_dtypes_are_refused(tmp_path, no_network):
    """q, k and v are concatenated into one qkv: torch.cat would promote an fp16 q to fp32 without a word."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from safetensors.torch import save_file

    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=16, patch_size=8
    )
    hf = transformers.ViTModel(config).eval()
    in_memory = r"weights from ViTModel state_dict: layer 0: q/k/v weight dtypes differ: \{'q': 'float16', 'k'"
    with pytest.raises(ValueError, match=in_memory):
        hf.layers[0].attention.q_proj.half()
        vit_fast.from_hf(hf)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    save_file(state, str(tmp_path / "hf.safetensors"))
    config.to_json_file(str(tmp_path / "config.json"))
    in_file = r"'.*hf.safetensors': layer 0: q/k/v bias dtypes differ: \{'k': 'float32', 'q': 'float16'"
    with pytest.raises(ValueError, match=in_file):
        vit_fast.load_model(str(tmp_path / "hf.safetensors"), config=str(tmp_path / "config.json"))


def test_the_conversion_a_refusal_advises_works(tmp_path, no_network):
    """A pickled file is refused with a command that converts it (run by the user, on a file they trust): that
    command, run as given, writes a safetensors file that loads; a timm training checkpoint (its arguments in an
    argparse.Namespace) loads as it is."""
    import argparse
    import shlex
    import subprocess
    import sys

    model = vit_fast.VisionTransformer(vit_fast.ViTConfig(**TINY), backend="torch").eval()
    torch.save(model, tmp_path / "whole model.pth")  # a space: the command must quote it
    with pytest.raises(
        ValueError, match=r"holds Python objects besides tensors \(vit_fast.model.vit.VisionTransformer\)"
    ) as info:
        vit_fast.load_model(str(tmp_path / "whole model.pth"), config=model.cfg)
    command = shlex.split(str(info.value).split(" instead: ", 1)[1])
    assert command[0] == "python" and "weights_only=False" in command[2]
    subprocess.run([sys.executable, *command[1:]], check=True, cwd=tmp_path, timeout=300)
    converted = vit_fast.load_model(str(tmp_path / "whole model.safetensors"), config=model.cfg, backend="torch")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(converted(x), model(x))
    torch.save({"state_dict": model.state_dict(), "args": argparse.Namespace(lr=0.1)}, tmp_path / "train.pth")
    trained = vit_fast.load_model(str(tmp_path / "train.pth"), config=model.cfg, backend="torch")
    assert all(
        torch.equal(a, b) for a, b in zip(trained.state_dict().values(), model.state_dict().values(), strict=True)
    )


def test_a_pickled_hf_folder_is_told_to_convert_into_the_file_transformers_reads(tmp_path, no_network):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=16, patch_size=8
    )
    (tmp_path / "hf").mkdir()
    config.to_json_file(str(tmp_path / "hf" / "config.json"))
    torch.save({"x": torch.nn.Linear(2, 2)}, tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(
        ValueError, match=r"pytorch_model.bin' holds Python objects.* give '.*hf/model.safetensors' inst"
    ):
        vit_fast.load_model(str(tmp_path / "hf"))
