"""`gpuflex export-model module:attr --example ...`: a program the gate passes, or one line
naming the mistake."""

from __future__ import annotations

from pathlib import Path

from marketplace.cli import main
from trainer.exported.archive import read_archive
from trainer.exported.gate import check_program


def test_export_model_writes_a_program_the_gate_passes(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "mynet.py").write_text(
        "from torch import nn\n"
        "def Net():\n"
        "    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))\n"
    )
    monkeypatch.chdir(tmp_path)
    argv = ["export-model", "mynet:Net", "--example", "float32[8,64]", "--example", "int64[8]",
            "-o", "net.pt2"]  # fmt: skip
    assert main(argv) == 0
    summary = check_program(read_archive(tmp_path / "net.pt2", 2**26))
    assert summary.input_shape == (64,) and summary.returns_logits
    assert main([*argv[:2], "--example", "float32[8,64]"]) == 2
    assert "two --example" in capsys.readouterr().err
    assert main(["export-model", "mynet:Nope", "--example", "x", "--example", "y"]) == 2
    assert "has no attribute 'Nope'" in capsys.readouterr().err
