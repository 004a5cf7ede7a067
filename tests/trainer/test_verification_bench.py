"""The verification bench's trials on a few real tasks: honest work passes the rules, each
cheat is rejected, and the section has the keys issue 35 names (figures: `python -m bench.run
--only verification`)."""

from __future__ import annotations

import pytest

from bench import verification_bench
from bench.verification_trials import CHEATS

pytestmark = pytest.mark.slow


def test_a_small_run_flags_no_honest_work_and_catches_every_cheat(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(verification_bench, "LIVE", tmp_path / "absent.json")
    v = verification_bench.run(mlp_seeds=1, cnn_seeds=1, shards=1)
    assert v["honest_flagged"]["flagged"] == 0 and v["honest_flagged"]["of"] > 100
    assert set(v["caught"]) == set(CHEATS) == set(v["segments"]["detection"])
    for name in CHEATS:
        assert v["segments"]["detection"][name]["per_check"] == 1.0, name
        assert v["caught"][name] > 0.99
    # the replica rule: every cheat but the precision claim, which passes across devices
    for name, d in v["replica_detection"].items():
        assert d["rejected"] == (0 if name == "precision_claim" else d["trials"]), name
    assert 0 < v["cheat_ev_ratio"] < 1 and v["overhead"] is None
    text = "\n".join(verification_bench.render(v))
    assert all(f"| {name} |" in text for name in CHEATS) and "not measured" in text
