"""examples/stdlib-lm.yaml and examples/lora-finetune.yaml: their files written offline by
`gpuflex examples write`, and both specs trained by `gpuflex-sim run` (small settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from marketplace.cli import main as gpuflex
from trainer.example_files import (
    CORPUS_FILE,
    GPT2_CHECKPOINT_FILE,
    GPT2_CONFIG_FILE,
    stdlib_sources,
    write_stdlib_corpus,
)
from trainer.sim.cli import main as sim

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def small(spec_file: str, folder: Path) -> Path:
    """The example spec, beside its files in `folder`, with a few short steps per round."""
    spec = yaml.safe_load((EXAMPLES / spec_file).read_text())
    spec["local"] = {"steps": 3, "batch_size": 8}
    spec["dataset"]["seq_len"] = 32
    path = folder / spec_file
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_corpus_is_the_stdlibs_source_bounded_and_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    count = write_stdlib_corpus(a, 100_000)
    write_stdlib_corpus(b, 100_000)
    assert a.read_bytes() == b.read_bytes()
    texts = [json.loads(line)["text"] for line in a.read_text().splitlines()]
    assert len(texts) == count > 5
    assert sum(len(t.encode()) for t in texts) <= 100_000
    sources = {p.read_text(encoding="utf-8") for p in stdlib_sources()[:200]}
    assert all(t in sources for t in texts)  # whole modules, unchanged
    assert not any("/test/" in p.as_posix() for p in stdlib_sources())


def test_gpuflex_examples_write_and_sim_run_stdlib_lm(tmp_path: Path, capsys) -> None:
    assert gpuflex(["examples", "write", str(tmp_path), "--corpus-bytes", "60000"]) == 0
    assert (tmp_path / CORPUS_FILE).is_file()
    capsys.readouterr()
    spec = small("stdlib-lm.yaml", tmp_path)
    assert sim(["run", str(spec), "--nodes", "2", "--rounds", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rounds"] == 2 and out["test_total"] > 0
    assert out["accuracy_per_round"][-1] > 1 / 256  # better than a uniform guess


def test_sim_run_lora_finetune_from_the_written_checkpoint(tmp_path: Path, capsys) -> None:
    pytest.importorskip("peft")
    assert gpuflex(["examples", "write", str(tmp_path), "--corpus-bytes", "40000"]) == 0
    config = json.loads((tmp_path / GPT2_CONFIG_FILE).read_text())
    assert config["model_type"] == "gpt2" and config["vocab_size"] == 256
    assert (tmp_path / GPT2_CHECKPOINT_FILE).stat().st_size > 0
    capsys.readouterr()
    spec = small("lora-finetune.yaml", tmp_path)
    assert sim(["run", str(spec), "--nodes", "2", "--rounds", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["rounds"] == 1
    # only the adapters travel up: far less than the 0.5 MB base per node
    assert out["bytes_up_per_node"] < 200_000
