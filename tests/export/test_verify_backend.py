"""verify() judges our triton backend by the same rule as an exported artifact."""

import pytest

from vit_fast import cli, export

from ..fakes import skip_if_interpreted_and_broken, tiny_model


def test_verify_triton_backend_passes():
    model = tiny_model(reg_tokens=1, init_values=0.1)
    report = export.verify(model, "triton", batches=[1, 3], seed=0, print_table=False)
    assert report.passed and len(report.rows) == 2
    assert "triton backend" in report.runtime
    assert all(r.max_abs_err <= r.bound for r in report.rows)
    assert model.backend == "torch"  # the caller's model is left as it was


def test_verify_triton_backend_catches_a_wrong_kernel(monkeypatch):
    import vit_fast.model.stages as tp

    real = tp.features_triton
    monkeypatch.setattr(tp, "features_triton", lambda m, x, grid, *rest: real(m, x, grid, *rest) * 1.01)
    with pytest.raises(export.VerificationError, match=r"worst is output 'output' at batch"):
        export.verify(tiny_model(), "triton", batches=[2], seed=0, print_table=False)


@skip_if_interpreted_and_broken
def test_verify_cli_triton(tmp_path, capsys):
    from vit_fast import save_checkpoint

    path = save_checkpoint(tiny_model(), tmp_path / "m.safetensors")
    assert cli.main(["verify", str(path), "triton", "--batch", "2", "--seed", "1"]) == 0
    assert "triton backend" in capsys.readouterr().out


def test_verify_triton_needs_gpu_or_interpreter(monkeypatch):
    from vit_fast.backend import runtime

    monkeypatch.setattr(runtime, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(runtime, "cuda_available", lambda: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        export.verify(tiny_model(), "triton", batches=[1], print_table=False)


def test_verify_cli_default_triton_caps_the_labelled_set_in_the_interpreter(capsys):
    pytest.importorskip("sklearn", reason="scikit-learn rebuilds the held-out set (pip install -e '.[demo]')")
    assert cli.main(["verify", "default", "triton", "--batch", "1", "--seed", "0", "--limit", "8"]) == 0
    captured = capsys.readouterr()
    assert "accuracy on the first 8 of 360 labelled images" in captured.err
    assert "labelled data (8 images)" in captured.out


def test_verify_cli_rejects_bad_limit(capsys):
    with pytest.raises(SystemExit) as exc:  # a usage error: rejected while parsing, before any work
        cli.main(["verify", "default", "triton", "--limit", "0"])
    assert exc.value.code == 2
    assert "argument --limit: must be >= 1, got 0" in capsys.readouterr().err
