"""Fault injection's copy and stale cheats (desktop.fault_injection): the updates a copier
sent, kept to be sent again. Test hooks only: the task pipeline calls these only for an agent
started as a Byzantine one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from desktop.task_runner import CHEAT_SOURCE, COPIERS

KEPT = 8  # updates a copier keeps to copy from


def _mode(byzantine: str) -> str:
    return byzantine.partition(":")[0]


def keep_sent(root: Path, byzantine: str, task: dict[str, Any], folder: Path) -> None:
    """A copier keeps the update it just sent, with the task's job, round and shard."""
    update = folder / "update.safetensors"
    if _mode(byzantine) not in COPIERS or not update.is_file():
        return
    root.mkdir(parents=True, exist_ok=True)
    name = f"{task.get('id')}.safetensors"
    shutil.copyfile(update, root / name)
    about = {"job_id": str(task.get("job_id")), "round": int(task.get("round") or 0),
             "shard_hash": str(task.get("shard_hash")), "file": name}  # fmt: skip
    (root / f"{task.get('id')}.json").write_text(json.dumps(about))
    for old in sorted(root.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-KEPT]:
        (root / json.loads(old.read_text())["file"]).unlink(missing_ok=True)
        old.unlink(missing_ok=True)


def put_source(root: Path, byzantine: str, task: dict[str, Any], folder: Path) -> bool:
    """What a copier sends for `task`, put in its folder: the newest kept update of the same
    job, of another shard (copy) or of the same shard from an earlier round (stale), else
    any earlier one of the job (claims prefer a node's own shards, so a copier that waited
    for the kind it wants would rarely cheat)."""
    mode = _mode(byzantine)
    if mode not in COPIERS or not root.is_dir():
        return False
    rnd = int(task.get("round") or 0)
    kept = [json.loads(p.read_text()) for p in
            sorted(root.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)]  # fmt: skip
    earlier = [a for a in kept if a["job_id"] == str(task.get("job_id")) and a["round"] < rnd]
    same = [a for a in earlier if a["shard_hash"] == str(task.get("shard_hash"))]
    other = [a for a in earlier if a not in same]
    wanted = (other + same) if mode == "copy" else (same + other)
    if not wanted:
        return False
    shutil.copyfile(root / wanted[0]["file"], folder / CHEAT_SOURCE)
    return True
