"""Text datasets: plain UTF-8 or JSONL, byte tokens or a Hugging Face tokenizer.json; errors
name the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer.datasets import DatasetError, load_dataset, load_text_dataset
from trainer.spec import DatasetSpec, SpecError, parse_spec

LINES = [f"def function_{i}(x):\n    return x * {i}  # ünïcode" for i in range(20)]


def bpe_tokenizer_json(corpus: list[str], vocab_size: int = 300) -> str:
    """A small byte-level BPE tokenizer trained on `corpus`, as tokenizer.json text."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    return tok.to_str()


def test_jsonl_documents_are_their_text_fields(tmp_path: Path) -> None:
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(LINES)))
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(t.replace("\n", " ") for t in LINES))
    got = load_text_dataset(jsonl, seq_len=16)
    assert got.num_classes == 256 and got.input_shape == (16,)
    # a JSONL document keeps its newlines: one more byte-token window per document here
    assert got.num_train + got.num_test > load_text_dataset(text, 16).num_train


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", r"line 3: not valid JSON"),
        ('{"txt": "x"}', r'line 3: each line is a JSON object with a "text" string'),
        ('["text"]', r"line 3: each line is a JSON object"),
        ('{"text": 5}', r"line 3: each line is a JSON object"),
        ("[" * 40 + "]" * 40, r"line 3: not valid JSON: nested deeper"),
    ],
)
def test_a_malformed_jsonl_line_is_named(tmp_path: Path, line: str, match: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "one two"}\n\n' + line + '\n{"text": "four"}\n')
    with pytest.raises(DatasetError, match=match):
        load_text_dataset(path)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_non_utf8_text_names_its_line(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"c{suffix}"
    path.write_bytes(b'{"text": "fine"}\n{"text": "also fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match=r"line 3: not valid UTF-8 at byte offset 52"):
        load_text_dataset(path)


def test_a_tokenizer_json_gives_its_ids_and_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(bpe_tokenizer_json(LINES))
    (tmp_path / "corpus.txt").write_text("\n".join(LINES))
    spec = DatasetSpec(kind="text", path="corpus.txt", tokenizer="tokenizer.json", seq_len=8)
    tokens = load_dataset(spec, base_dir=tmp_path)
    raw = load_dataset(spec.model_copy(update={"tokenizer": None}), base_dir=tmp_path)
    assert tokens.num_classes == 300  # the byte alphabet and 44 merges
    assert int(tokens.x_train.max()) >= 256  # merged tokens are used
    # merges make fewer tokens than bytes, so fewer windows of 8
    assert tokens.num_train + tokens.num_test < raw.num_train + raw.num_test
    # the windows overlap by one token: each window's targets are its inputs shifted
    n = int(tokens.lengths_train[0])
    assert torch.equal(tokens.x_train[0, 1:n], tokens.y_train[0, : n - 1])


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"\xff\xfe", "not valid JSON"),
        (b'{"version": "1.0"}', "not a Hugging Face tokenizer.json"),
        (b'{"model": {"type": "Nonsense"}}', "not a usable tokenizer.json"),
    ],
)
def test_a_bad_tokenizer_is_named(tmp_path: Path, content: bytes, match: str) -> None:
    pytest.importorskip("tokenizers")
    (tmp_path / "tok.json").write_bytes(content)
    (tmp_path / "c.txt").write_text("\n".join(LINES))
    with pytest.raises(DatasetError, match=match):
        load_text_dataset(tmp_path / "c.txt", tokenizer=tmp_path / "tok.json")


def test_the_tokenizer_field_is_for_text_only() -> None:
    with pytest.raises(SpecError, match="'tokenizer' is for dataset kind 'text'"):
        parse_spec({"name": "x", "dataset": {"kind": "csv", "path": "a.csv",
                                             "tokenizer": "t.json"}})  # fmt: skip
