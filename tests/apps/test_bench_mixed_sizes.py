"""The mixed-size bench: packed against padded to the largest, its counts, its check and its command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vit_fast.bench import BenchError, Sampling
from vit_fast.bench.mixed_sizes import padded_batch, parse_sizes, random_sizes, run_mixed_sizes, token_counts

from ..fakes import load_script, tiny_model

ROOT = Path(__file__).resolve().parents[2]
FAST = Sampling(warmup=0, min_samples=2)


def test_packed_and_padded_rows_count_what_each_computes():
    model = tiny_model(dynamic_img_size=True, reg_tokens=1)  # 8-px patches, 2 prefix tokens
    sizes = [(32, 32), (16, 40), (8, 8)]  # 16, 10, 1 patches; padded to 32x40: 20 patches each
    result = run_mixed_sizes(model, sizes, sampling=FAST)
    packed, padded = result["rows"]
    assert (packed["mode"], padded["mode"]) == ("packed", "padded")
    assert (packed["tokens"], padded["tokens"]) == (18 + 12 + 3, 3 * 22)
    assert (packed["attention_pairs_per_block"], padded["attention_pairs_per_block"]) == (18**2 + 12**2 + 9, 3 * 22**2)
    assert result["padded_to"] == "32x40" and result["sizes"] == ["32x32", "16x40", "8x8"]
    assert result["ratios"]["padded_over_packed_tokens"] == pytest.approx(66 / 33)
    assert result["ratios"]["packed_speedup_median"] == pytest.approx(padded["median_ms"] / packed["median_ms"])
    for row in result["rows"]:
        assert row["n"] >= 2 and row["images"] == 3
        assert row["images_per_s"] == pytest.approx(3 / (row["median_ms"] / 1e3))
    assert result["max_abs_err_vs_alone"] < 1e-5


def test_padded_batch_puts_each_image_top_left():
    images = [torch.ones(3, 8, 16), 2 * torch.ones(3, 16, 8)]
    batch = padded_batch(images)
    assert batch.shape == (2, 3, 16, 16)
    assert batch[0, :, :8, :16].eq(1).all() and batch[0, :, 8:].eq(0).all()
    assert batch[1, :, :, :8].eq(2).all() and batch[1, :, :, 8:].eq(0).all()
    assert token_counts(tiny_model(dynamic_img_size=True), [(8, 16), (16, 8)])["padded_tokens"] == 2 * (1 + 4)


def test_a_wrong_packed_answer_is_never_timed(monkeypatch):
    model = tiny_model(dynamic_img_size=True)
    real = model.forward_packed
    monkeypatch.setattr(model, "forward_packed", lambda images: real(images) + 1)
    with pytest.raises(BenchError, match=r"packed forward differs from each image's forward alone .*not timed"):
        run_mixed_sizes(model, [(16, 16), (8, 24)], sampling=FAST)


def test_a_fixed_size_model_is_refused():
    with pytest.raises(BenchError, match="dynamic_img_size=True"):
        run_mixed_sizes(tiny_model(), [(32, 32), (16, 16)], sampling=FAST)


def test_sizes_parse_and_random_sizes_are_patch_multiples():
    assert parse_sizes("224x224, 160x256") == [(224, 224), (160, 256)]
    with pytest.raises(BenchError, match=r"HxW pairs.*got '224'"):
        parse_sizes("224,160x256")
    sizes = random_sizes(20, 16, 64, 224, seed=3)
    assert sizes == random_sizes(20, 16, 64, 224, seed=3) and len(set(sizes)) > 1
    assert all(64 <= s <= 224 and s % 16 == 0 for size in sizes for s in size)


def test_the_script_prints_and_writes_json(tmp_path, capsys):
    script = load_script(ROOT / "benchmarks" / "mixed_sizes.py", "mixed_sizes_script")
    out = tmp_path / "mixed.json"
    argv = ["--model", "vit_tiny_patch16_224", "--sizes", "32x48,16x16", "--min-samples", "2", "--min-time", "0"]
    threads = torch.get_num_threads()
    try:
        assert script.main([*argv, "--warmup", "0", "--threads", "1", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "padded / packed: tokens" in printed and "vit_tiny_patch16_224, torch backend, fp32" in printed
    result = json.loads(out.read_text())
    assert [row["mode"] for row in result["rows"]] == ["packed", "padded"]
    assert result["padded_to"] == "32x48" and result["weights"] == "random (seed 0)"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--sizes", "abc"], "argument --sizes: image sizes are HxW pairs"),
        (["--sizes", "65536x65536"], "each side must be a multiple of the patch size 16 from 16 to 4096"),
        (["--sizes", "20x32"], "20x32: each side must be a multiple of the patch size 16"),
        (["--sizes", ",".join(["4096x4096"] * 64)], "more than the"),  # bounded by the memory here, before work
        (["--random", "0"], "argument --random: must be an int from 1 to 4096, got '0'"),
        (["--dtype", "fp8"], "argument --dtype: unknown dtype 'fp8'"),
        (["--min-time", "nan"], "argument --min-time: must be a number from 0 to 3600"),
        (["--model", "no_such_model"], "argument --model:"),
        (["--json", "r.txt"], "--json"),
    ],
)
def test_every_bad_argument_is_one_line_and_exit_2_before_work(argv, says, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    script = load_script(ROOT / "benchmarks" / "mixed_sizes.py", "mixed_sizes_script")
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and says in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs --device cuda")
def test_device_cuda_without_a_gpu_is_a_usage_error(capsys):
    script = load_script(ROOT / "benchmarks" / "mixed_sizes.py", "mixed_sizes_script")
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--device", "cuda"])
    assert exit_info.value.code == 2 and "torch sees no CUDA GPU here" in capsys.readouterr().err
