"""The files examples/stdlib-lm.yaml and examples/lora-finetune.yaml train on, written offline:
a corpus of the Python standard library's own source, and a tiny GPT-2 (its config.json
and a safetensors checkpoint of generated weights) for LoRA to fine-tune.

Nothing is downloaded: the corpus is read from this Python's stdlib folder, in sorted
order and cut at a byte budget, so the same Python gives the same corpus on every machine.
`gpuflex examples write DIR` calls `write_examples`.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch

CORPUS_FILE = "stdlib.jsonl"
GPT2_CONFIG_FILE = "tiny-gpt2.json"
GPT2_CHECKPOINT_FILE = "tiny-gpt2.safetensors"
DEFAULT_CORPUS_BYTES = 2 * 2**20
# a GPT-2 small enough to fine-tune on a laptop CPU in minutes; byte-level (vocab 256)
TINY_GPT2 = {
    "model_type": "gpt2",
    "vocab_size": 256,
    "n_positions": 128,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
# folders of the stdlib that are tests, tools or third-party packages, not its own library
_SKIP = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__",
                   "lib2to3", "turtledemo", "ensurepip", "config-3"})  # fmt: skip


def stdlib_sources(root: Path | None = None) -> list[Path]:
    """The stdlib's .py files, sorted by their path inside the stdlib folder."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py")
             if not any(part in _SKIP or part.startswith("config-")
                        for part in p.relative_to(root).parts[:-1])]  # fmt: skip
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def write_stdlib_corpus(
    path: Path, max_bytes: int = DEFAULT_CORPUS_BYTES, root: Path | None = None
) -> int:
    """JSONL, one stdlib module's source per line ({"text": ...}), until `max_bytes` of
    source; the number of modules written."""
    written = count = 0
    with path.open("w", encoding="utf-8") as out:
        for file in stdlib_sources(root):
            try:
                text = file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # a few test fixtures are deliberately not UTF-8
            size = len(text.encode("utf-8"))
            if not text.strip() or written + size > max_bytes:
                continue
            out.write(json.dumps({"text": text}) + "\n")
            written, count = written + size, count + 1
    return count


def write_tiny_gpt2(folder: Path, seed: int = 1234) -> tuple[Path, Path]:
    """config.json and a checkpoint of generated weights (as `save_pretrained` writes them:
    the LM head, tied to the embeddings, is left out)."""
    import safetensors.torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_path = folder / GPT2_CONFIG_FILE
    config_path.write_text(json.dumps(TINY_GPT2, indent=2) + "\n")
    config = AutoConfig.for_model(**TINY_GPT2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # fmt: skip
    checkpoint = folder / GPT2_CHECKPOINT_FILE
    safetensors.torch.save_file(state, str(checkpoint))
    return config_path, checkpoint


def write_examples(folder: Path, corpus_bytes: int = DEFAULT_CORPUS_BYTES) -> list[Path]:
    """Every example's files into `folder` (made if missing); the paths written. The tiny
    GPT-2 needs `transformers` (pip install 'gpuflex[models]'): without it only the corpus
    is written."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / CORPUS_FILE
    write_stdlib_corpus(corpus, corpus_bytes)
    try:
        return [corpus, *write_tiny_gpt2(folder)]
    except ImportError:
        return [corpus]
