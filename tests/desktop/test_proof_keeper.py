"""desktop.proof_keeper: an uploaded task's checkpoints kept, revealed on request, bounded."""

from __future__ import annotations

import os
from pathlib import Path

from desktop.client import ApiError
from desktop.proof_keeper import ASK_FOR_S, MAX_AGE_S, MAX_TASKS, ProofKeeper
from desktop.task_runner import CHECKPOINT


class _Server:
    """What the marketplace's proof endpoints answer, recorded (no network in this test)."""

    def __init__(self, requests: list[dict]) -> None:
        self.requests = requests
        self.got: list[tuple[int, int, bytes]] = []
        self.asked = 0

    def proof_requests(self) -> list[dict]:
        self.asked += 1
        return self.requests

    def put_checkpoint(self, check_id: int, step: int, data: bytes) -> str:
        if step == 99:
            raise ApiError(422, "bad", "not asked")
        self.got.append((check_id, step, data))
        return "requested"


def _task_folder(tmp_path: Path, steps: list[int]) -> Path:
    folder = tmp_path / "task"
    folder.mkdir()
    for s in steps:
        (folder / CHECKPOINT.format(s)).write_bytes(f"state {s}".encode())
    (folder / "update.safetensors").write_bytes(b"not kept")
    return folder


def test_kept_checkpoints_are_revealed_byte_for_byte_then_dropped(tmp_path: Path) -> None:
    now = [1_000_000.0]
    keeper = ProofKeeper(tmp_path / "proofs", clock=lambda: now[0])
    server = _Server([{"id": 7, "task_id": "t-1", "steps": [0, 2, 99]}])
    assert keeper.reveal_pending(server) == 0 and server.asked == 0  # no upload: never asks
    assert keeper.keep("t-1", _task_folder(tmp_path, [0, 2, 4])) == 3
    assert not (tmp_path / "proofs" / "t-1" / "update.safetensors").exists()
    assert keeper.reveal_pending(server) == 2
    assert server.got == [(7, 0, b"state 0"), (7, 2, b"state 2")]
    assert not (tmp_path / "proofs" / "t-1").exists()  # asked once: never needed again
    assert keeper.reveal_pending(server) == 0 and server.asked == 1  # at most every POLL_S
    now[0] += 10
    assert keeper.reveal_pending(server) == 0 and server.asked == 2  # the upload is recent
    now[0] += ASK_FOR_S
    assert keeper.reveal_pending(server) == 0 and server.asked == 2  # an hour on: not asked


def test_a_symlinked_checkpoint_is_never_followed(tmp_path: Path) -> None:
    folder = _task_folder(tmp_path, [0])
    secret = tmp_path / "secret"
    secret.write_bytes(b"the owner's file")
    (folder / CHECKPOINT.format(4)).symlink_to(secret)
    keeper = ProofKeeper(tmp_path / "proofs")
    assert keeper.keep("t-1", folder) == 1
    assert not (tmp_path / "proofs" / "t-1" / CHECKPOINT.format(4)).exists()


def test_old_and_surplus_tasks_are_pruned(tmp_path: Path) -> None:
    now = [1_000_000.0]
    keeper = ProofKeeper(tmp_path / "proofs", clock=lambda: now[0])
    for i in range(MAX_TASKS + 2):
        folder = tmp_path / f"f{i}"
        folder.mkdir()
        (folder / CHECKPOINT.format(0)).write_bytes(b"x")
        keeper.keep(f"t-{i}", folder)
        os.utime(tmp_path / "proofs" / f"t-{i}", (now[0] - 100 + i, now[0] - 100 + i))
    keeper.prune()
    left = sorted(p.name for p in (tmp_path / "proofs").iterdir())
    assert len(left) == MAX_TASKS and "t-0" not in left and "t-1" not in left
    now[0] += MAX_AGE_S + 1000
    keeper.prune()
    assert list((tmp_path / "proofs").iterdir()) == []


def test_a_copier_is_handed_another_shards_update_a_stale_one_its_own_older_one(
    tmp_path: Path,
) -> None:
    from desktop.cheat_sources import keep_sent, put_source
    from desktop.task_runner import CHEAT_SOURCE

    root = tmp_path / "byzantine"
    sent = {("a", 1): b"shard a round 1", ("b", 1): b"shard b round 1"}
    for i, ((shard, rnd), data) in enumerate(sent.items()):
        folder = tmp_path / f"sent{i}"
        folder.mkdir()
        (folder / "update.safetensors").write_bytes(data)
        keep_sent(root, "copy", {"id": f"t{i}", "job_id": "j", "round": rnd,
                                 "shard_hash": shard}, folder)  # fmt: skip
    nxt = tmp_path / "next"
    nxt.mkdir()
    assert put_source(root, "copy", {"job_id": "j", "round": 2, "shard_hash": "a"}, nxt)
    assert (nxt / CHEAT_SOURCE).read_bytes() == b"shard b round 1"
    assert put_source(root, "stale", {"job_id": "j", "round": 2, "shard_hash": "a"}, nxt)
    assert (nxt / CHEAT_SOURCE).read_bytes() == b"shard a round 1"
    # without its kind, any earlier one; nothing earlier, another job, an honest mode: none
    assert put_source(root, "stale", {"job_id": "j", "round": 2, "shard_hash": "c"}, nxt)
    assert not put_source(root, "stale", {"job_id": "j", "round": 1, "shard_hash": "a"}, nxt)
    assert not put_source(root, "copy", {"job_id": "k", "round": 2, "shard_hash": "a"}, nxt)
    assert not put_source(root, "noise", {"job_id": "j", "round": 2, "shard_hash": "a"}, nxt)


def test_a_restarted_agent_still_answers_for_what_it_kept(tmp_path: Path) -> None:
    ProofKeeper(tmp_path / "proofs").keep("t-1", _task_folder(tmp_path, [0]))
    again = ProofKeeper(tmp_path / "proofs")  # the agent started anew
    server = _Server([{"id": 3, "task_id": "t-1", "steps": [0]}])
    assert again.reveal_pending(server) == 1 and server.got == [(3, 0, b"state 0")]
