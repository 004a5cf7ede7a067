"""A Hugging Face tokenizer.json for text datasets: JSON only, read by the `tokenizers`
package (Rust), never a pickled or remote-code tokenizer, never fetched from a hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.datasets.errors import DatasetError
from trainer.nesting import TooDeep, loads_json

# GPT-2's tokenizer.json is 1.4 MB and large multilingual ones about 20 MB
MAX_TOKENIZER_BYTES = 32 * 2**20
# a tokenizer.json's merges and vocabulary sit 3-4 levels deep; normalizer sequences a few more
_MAX_DEPTH = 16


def read_tokenizer_json(path: str | Path) -> str:
    """The text of the tokenizer.json in `path`, checked by bounded means only (its size,
    UTF-8, JSON nesting, a 'model' object): what a web request may do with a buyer's file.
    Building it (load_tokenizer) runs the buyer's regexes in Rust, which may panic or run
    away: the marketplace does that in a child process (trainer/isolated.py)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DatasetError(f"{path.name}: cannot read the tokenizer: {exc.strerror}") from None
    if size > MAX_TOKENIZER_BYTES:
        raise DatasetError(
            f"{path.name}: the tokenizer is {size} bytes; the limit is {MAX_TOKENIZER_BYTES}"
        )
    try:
        text = path.read_bytes().decode("utf-8")
        data = loads_json(text, limit=_MAX_DEPTH)
    except (UnicodeDecodeError, ValueError, TooDeep) as exc:
        raise DatasetError(f"{path.name}: the tokenizer is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise DatasetError(
            f"{path.name}: not a Hugging Face tokenizer.json (a JSON object with a 'model')"
        )
    return text


def load_tokenizer(path: str | Path) -> Any:
    """The `tokenizers.Tokenizer` in `path`; DatasetError naming what is wrong with it."""
    path = Path(path)
    text = read_tokenizer_json(path)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DatasetError(
            "a tokenizer.json needs the 'tokenizers' package: pip install 'gpuflex[models]'"
        ) from None
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # the Rust side raises a bare Exception for a malformed file
        raise DatasetError(f"{path.name}: not a usable tokenizer.json: {exc}") from None
    if tokenizer.get_vocab_size() < 2:
        raise DatasetError(f"{path.name}: the tokenizer's vocabulary is empty")
    return tokenizer
