from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from trainer.aggregation import ClientUpdate, build_strategy
from trainer.artifacts import ArtifactStore
from trainer.hashing import state_hash
from trainer.provenance import (
    GENESIS,
    Contribution,
    ProvenanceChain,
    ProvenanceError,
    RoundRecord,
    record_round,
    verify_chain,
    verify_with_artifacts,
)
from trainer.spec import AggregationSpec

NODES = ("node-a", "node-b", "node-c")
ROUNDS = 3


@dataclass
class Run:
    chain: ProvenanceChain
    store: ArtifactStore
    spec: AggregationSpec


def _random_state(g: torch.Generator, scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {
        "layer.weight": torch.randn(5, 4, generator=g) * scale,
        "layer.bias": torch.randn(5, generator=g) * scale,
    }


def _build_run(tmp_path: Path, spec: AggregationSpec, seed: int = 0) -> Run:
    """Three honest rounds: aggregate first, then record (as the simulator does)."""
    g = torch.Generator().manual_seed(seed)
    store = ArtifactStore(tmp_path / "artifacts")
    chain = ProvenanceChain("prov-test")
    strategy = build_strategy(spec)
    global_state = _random_state(g)
    for rnd in range(1, ROUNDS + 1):
        updates = [
            (
                ClientUpdate(node, _random_state(g, 0.1), 10 + 7 * i, {"loss": 1.0 / rnd + i}),
                f"{i:064x}",  # shard hash
            )
            for i, node in enumerate(NODES)
        ]
        before = {k: v.clone() for k, v in strategy.state_dict().items()}
        new_state = strategy.aggregate(global_state, [u for u, _ in updates])
        record_round(
            chain,
            store,
            round=rnd,
            global_state=global_state,
            strategy=strategy,
            strategy_state_before=before,
            updates=updates,
            new_state=new_state,
            metrics={"accuracy": 0.5 + 0.1 * rnd, "loss": 2.0 / rnd},
        )
        global_state = new_state
    return Run(chain, store, spec)


@pytest.fixture(params=["fedavg", "fedadam"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Run:
    return _build_run(tmp_path, AggregationSpec(strategy=request.param, server_lr=0.5))


def _reseal(job: str, records: list[RoundRecord]) -> ProvenanceChain:
    """What a forger would do after editing: recompute every hash and link."""
    out, prev = [], GENESIS
    for rec in records:
        rec = replace(rec, prev_hash=prev, record_hash="")
        rec = replace(rec, record_hash=rec.compute_hash())
        out.append(rec)
        prev = rec.record_hash
    return ProvenanceChain(job, out)


def _problems_for(report_problems: list[str], rnd: int) -> list[str]:
    return [p for p in report_problems if p.startswith(f"round {rnd}:")]


# -- honest chains -------------------------------------------------------------------------


def test_honest_chain_verifies_with_replay(run: Run) -> None:
    report = verify_with_artifacts(run.chain, run.store, run.spec)
    assert report.ok, str(report)
    assert (report.rounds_checked, report.rounds_replayed) == (ROUNDS, ROUNDS)
    records = run.chain.records
    assert [r.round for r in records] == [1, 2, 3]
    assert records[0].prev_hash == GENESIS
    assert run.chain.head == records[-1].record_hash
    assert [c.node_id for c in records[0].contributions] == list(NODES)
    assert records[0].strategy == run.spec.strategy


def test_json_round_trip_keeps_hashes(run: Run) -> None:
    loaded = ProvenanceChain.from_json(run.chain.to_json())
    assert loaded.records == run.chain.records
    assert loaded.head == run.chain.head
    assert verify_with_artifacts(loaded, run.store, run.spec).ok


def test_fedadam_records_the_state_before_each_round(tmp_path: Path) -> None:
    run = _build_run(tmp_path, AggregationSpec(strategy="fedadam"))
    hashes = [r.strategy_state_hash for r in run.chain]
    assert len(set(hashes)) == ROUNDS  # the optimiser state moves every round
    # a chain recorded with the state *after* each round must fail replay
    shifted = [
        replace(rec, strategy_state_hash=nxt)
        for rec, nxt in zip(run.chain, hashes[1:], strict=False)
    ]
    forged = _reseal(run.chain.job, [*shifted, run.chain.records[-1]])
    report = verify_with_artifacts(forged, run.store, run.spec)
    assert not report.ok
    assert any("output model hash mismatch" in p for p in _problems_for(report.problems, 1))


def test_replay_with_a_different_strategy_is_reported(tmp_path: Path) -> None:
    run = _build_run(tmp_path, AggregationSpec(strategy="fedavg"))
    report = verify_with_artifacts(run.chain, run.store, AggregationSpec(strategy="fedadam"))
    assert not report.ok
    assert report.rounds_replayed == 0
    assert any("strategy mismatch" in p for p in _problems_for(report.problems, 2))


def test_record_hash_covers_canonical_json() -> None:
    rec = RoundRecord(
        job="j",
        round=1,
        input_model_hash="a" * 64,
        strategy="fedavg",
        strategy_params={"server_lr": 1.0},
        strategy_state_hash="b" * 64,
        contributions=(Contribution("n", "c" * 64, "d" * 64, 3, {"loss": 0.5}),),
        output_model_hash="e" * 64,
        metrics={"accuracy": 0.25},
        prev_hash=GENESIS,
        record_hash="",
    )
    body = {k: v for k, v in rec.to_dict().items() if k != "record_hash"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert rec.compute_hash() == hashlib.sha256(text.encode()).hexdigest()
    assert replace(rec, metrics={"accuracy": 0.26}).compute_hash() != rec.compute_hash()


# -- tampering -----------------------------------------------------------------------------


def test_tampered_metric_is_caught(run: Run) -> None:
    doc = json.loads(run.chain.to_json())
    doc["records"][1]["metrics"]["accuracy"] = 0.99
    tampered = ProvenanceChain.from_json(json.dumps(doc))
    for report in (
        verify_chain(tampered),
        verify_with_artifacts(tampered, run.store, run.spec),
    ):
        assert not report.ok
        assert any("record hash mismatch" in p for p in _problems_for(report.problems, 2))
        assert not _problems_for(report.problems, 1)


def test_tampered_contribution_is_caught(run: Run) -> None:
    records = list(run.chain)
    rec = records[1]
    other = records[0].contributions[0].update_hash  # a real artifact, just the wrong one
    forged_c = replace(rec.contributions[0], update_hash=other)
    records[1] = replace(rec, contributions=(forged_c, *rec.contributions[1:]))
    tampered = ProvenanceChain(run.chain.job, records)
    report = verify_with_artifacts(tampered, run.store, run.spec)
    assert not report.ok
    round2 = _problems_for(report.problems, 2)
    assert any("record hash mismatch" in p for p in round2)
    assert any("output model hash mismatch" in p for p in round2)
    # re-sealing hides the edit from the chain checks, but not from the replay
    resealed = _reseal(run.chain.job, records)
    assert verify_chain(resealed).ok
    report = verify_with_artifacts(resealed, run.store, run.spec)
    assert not report.ok
    assert any("output model hash mismatch" in p for p in _problems_for(report.problems, 2))


def test_reordered_records_are_caught(run: Run) -> None:
    r1, r2, r3 = run.chain.records
    report = verify_chain(ProvenanceChain(run.chain.job, [r2, r1, r3]))
    assert not report.ok
    assert any("broken link" in p for p in _problems_for(report.problems, 2))
    assert any("out of order" in p for p in _problems_for(report.problems, 1))


def test_deleted_record_is_caught(run: Run) -> None:
    r1, _, r3 = run.chain.records
    report = verify_chain(ProvenanceChain(run.chain.job, [r1, r3]))
    assert not report.ok
    round3 = _problems_for(report.problems, 3)
    assert any("broken link" in p for p in round3)
    assert any("follows round 1" in p for p in round3)
    assert any("not round 1's output" in p for p in round3)


def test_truncated_chain_needs_expected_head(run: Run) -> None:
    head = run.chain.head
    truncated = ProvenanceChain(run.chain.job, list(run.chain.records[:2]))
    assert verify_chain(truncated).ok  # links are fine: only an anchor shows the cut
    report = verify_chain(truncated, expected_head=head)
    assert not report.ok and "expected head" in report.problems[0]


def test_broken_link_is_caught(run: Run) -> None:
    records = list(run.chain)
    bad = replace(records[2], prev_hash="f" * 64, record_hash="")
    records[2] = replace(bad, record_hash=bad.compute_hash())  # record itself is consistent
    report = verify_chain(ProvenanceChain(run.chain.job, records))
    assert not report.ok
    assert len(report.problems) == 1
    assert report.problems[0].startswith("round 3: broken link: prev_hash ffffffffffff")


def test_swapped_artifact_is_caught(run: Run) -> None:
    rec = run.chain.records[1]
    target = run.store.state_path(rec.contributions[0].update_hash)
    shutil.copyfile(run.store.state_path(rec.contributions[1].update_hash), target)
    report = verify_with_artifacts(run.chain, run.store, run.spec)
    assert not report.ok
    round2 = _problems_for(report.problems, 2)
    assert any("update from node-a" in p and "does not match its key" in p for p in round2)
    assert any("not replayed" in p for p in round2)
    assert report.rounds_replayed == ROUNDS - 1


def test_dishonest_output_is_caught(tmp_path: Path) -> None:
    # a coordinator that records a model other than the aggregate of what it received
    honest = _build_run(tmp_path / "honest", AggregationSpec(strategy="fedavg"))
    records = list(honest.chain)
    honest_output = records[1].output_model_hash
    g = torch.Generator().manual_seed(99)
    fake_key = honest.store.put_state(_random_state(g))
    records[1] = replace(records[1], output_model_hash=fake_key)
    records[2] = replace(records[2], input_model_hash=fake_key)
    forged = _reseal(honest.chain.job, records)
    assert verify_chain(forged).ok
    report = verify_with_artifacts(forged, honest.store, honest.spec)
    assert not report.ok
    round2 = _problems_for(report.problems, 2)
    assert len(round2) == 1
    assert round2[0] == (
        f"round 2: output model hash mismatch: recorded {fake_key[:12]}…, "
        f"recomputed {honest_output[:12]}…"
    )


def test_missing_artifact_is_a_problem_not_a_crash(run: Run) -> None:
    rec = run.chain.records[1]
    run.store.state_path(rec.input_model_hash).unlink()
    report = verify_with_artifacts(run.chain, run.store, run.spec)
    assert not report.ok
    round2 = _problems_for(report.problems, 2)
    assert any("input model" in p and "not found" in p for p in round2)
    assert report.rounds_replayed == ROUNDS - 1
    assert verify_chain(run.chain).ok  # the chain itself is untouched


def test_round_without_contributions_must_carry_the_model_over(tmp_path: Path) -> None:
    # every node dropped out: the simulator keeps the model and records an empty round
    spec = AggregationSpec(strategy="fedadam")
    run = _build_run(tmp_path, spec)
    last = run.chain.records[-1]
    strategy = build_strategy(spec)
    before = run.store.get_state(last.strategy_state_hash)
    model = run.store.get_state(last.output_model_hash)
    kwargs = {"global_state": model, "strategy": strategy, "updates": [], "metrics": {}}
    record_round(
        run.chain, run.store, round=4, strategy_state_before=before, new_state=model, **kwargs
    )
    report = verify_with_artifacts(run.chain, run.store, spec)
    assert report.ok, str(report)
    assert report.rounds_replayed == ROUNDS + 1
    changed = {k: v + 1 for k, v in model.items()}
    record_round(
        run.chain, run.store, round=5, strategy_state_before=before, new_state=changed, **kwargs
    )
    report = verify_with_artifacts(run.chain, run.store, spec)
    round5 = _problems_for(report.problems, 5)
    assert len(round5) == 1 and "no contributions" in round5[0]


# -- construction ----------------------------------------------------------------------------


def test_append_refuses_a_chain_that_could_not_verify(tmp_path: Path) -> None:
    spec = AggregationSpec(strategy="fedavg")
    run = _build_run(tmp_path, spec)
    strategy = build_strategy(spec)
    last = run.chain.records[-1]
    common = {"strategy": strategy, "contributions": (), "output_model_hash": "0" * 64}
    with pytest.raises(ProvenanceError, match="expected round 4"):
        run.chain.append(round=5, input_model_hash=last.output_model_hash, metrics={}, **common)
    with pytest.raises(ProvenanceError, match="not the previous round's output"):
        run.chain.append(round=4, input_model_hash="1" * 64, metrics={}, **common)
    assert len(run.chain) == ROUNDS


def test_from_json_rejects_malformed_documents() -> None:
    with pytest.raises(ProvenanceError, match="malformed"):
        ProvenanceChain.from_json("{")
    with pytest.raises(ProvenanceError, match="not a provenance chain"):
        ProvenanceChain.from_json(json.dumps({"format": "other", "job": "x", "records": []}))
    doc = {"format": "gpuflex/provenance-v1", "job": "x", "records": [{"round": 1}]}
    with pytest.raises(ProvenanceError, match="malformed"):
        ProvenanceChain.from_json(json.dumps(doc))


def test_empty_chain() -> None:
    chain = ProvenanceChain("empty")
    assert chain.head == GENESIS
    report = verify_chain(chain)
    assert report.ok and report.rounds_checked == 0
    assert ProvenanceChain.from_json(chain.to_json()).head == GENESIS


def test_update_hash_is_the_state_hash_of_the_delta(run: Run) -> None:
    for rec in run.chain:
        for c in rec.contributions:
            assert state_hash(run.store.get_state(c.update_hash)) == c.update_hash
