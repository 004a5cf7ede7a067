"""kind: sweep through the marketplace: trials are child training jobs, scheduled to nodes
like any other, funded from the sweep's escrow; the median pruner stops poor ones; the sweep
ends with its best trial's model (tests/marketplace/agents.py does what the runner does)."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from marketplace.cli import trial_lines
from marketplace.jobs.models import Job
from marketplace.ledger import accounts
from marketplace.ledger.posting import balance
from marketplace.rounds.models import Task
from marketplace.sweeps.models import SweepTrial
from tests.marketplace.helpers import SMALL_SPEC
from tests.marketplace.test_job_flow import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def sweep_spec(**sweep: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec["name"] = "digits-sweep"
    spec["kind"] = "sweep"
    spec["rounds"] = {"max_rounds": 3, "target": {"metric": "accuracy", "value": 0.99}}
    spec["sweep"] = {
        "trials": 3,
        "parallel": 2,
        "startup_trials": 1,
        "warmup_rounds": 0,
        "space": {"lr": {"low": 0.0001, "high": 0.5, "log": True}, "width": [16, 32]},
    } | sweep
    return spec


def test_a_sweep_runs_its_trials_as_child_jobs_and_ends_with_the_best(
    make_agent, submit, buyer, make_user
) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(spec=sweep_spec(), tier="platform", budget="30")
    assert job["kind"] == "sweep" and job["status"] == "running"
    sweep = Job.objects.get(pk=job["id"])
    # two trials at once, funded from the sweep's escrow, ten credits each
    children = list(sweep.children.order_by("created_at"))
    assert len(children) == 2 and all(c.budget == Decimal("10.0000") for c in children)
    assert not Task.objects.filter(round__job=sweep).exists()  # the sweep trains nothing

    run_until_idle(agents)

    sweep.refresh_from_db()
    trials = list(SweepTrial.objects.filter(sweep=sweep).order_by("number"))
    assert [t.number for t in trials] == [0, 1, 2]
    assert len({str(t.params) for t in trials}) == 3  # TPE asked three different settings
    assert {t.state for t in trials} <= {"completed", "pruned"}
    assert any(t.state == "completed" for t in trials)
    for t in trials:  # each an ordinary job whose tasks nodes worked on
        assert t.job is not None and t.job.parent_id == sweep.pk
        assert Task.objects.filter(round__job=t.job, status="done").exists()
        assert t.job.status == ("completed" if t.state == "completed" else "stopped")
        assert (t.job.stop_reason == "pruned") == (t.state == "pruned")
        assert len(t.intermediate) == t.job.rounds_done
    assert sweep.status == "completed"
    detail = buyer.get(f"/api/v1/jobs/{sweep.pk}/").json()
    best = detail["best_trial"]
    done = [t for t in trials if t.state == "completed"]
    assert best == min(done, key=lambda t: (t.value, t.number)).number
    best_job = trials[best].job
    assert sweep.model_hash == best_job.model_hash and detail["model_hash"] == best_job.model_hash
    assert f"best: trial #{best}" in detail["stop_reason"]
    # its model downloads, and exports with the best trial's width, not the base spec's
    assert buyer.get(f"/api/v1/jobs/{sweep.pk}/model").status_code == 200
    onnx = buyer.get(f"/api/v1/jobs/{sweep.pk}/model?format=onnx")
    assert onnx.status_code == 200, onnx.content
    assert [t["number"] for t in detail["trials"]] == [0, 1, 2]
    assert detail["trials"][best]["params"] == trials[best].params
    assert all(Decimal(t["cost"]) > 0 for t in detail["trials"])
    lines = trial_lines(detail)  # `gpuflex jobs` lists them under the sweep, the best starred
    assert len(lines) == 3 and lines[best].startswith(f"  *trial {best} ")
    assert all("lr=" in line and "width=" in line for line in lines)
    # every credit not paid for work is back with the buyer; the sweep's escrow is empty
    assert balance(accounts.job_escrow(sweep)) == 0
    assert all(balance(accounts.job_escrow(t.job)) == 0 for t in trials)
    spent = sum(Decimal(t["cost"]) for t in detail["trials"])
    assert Decimal(detail["costs"]["refunded"]) == Decimal("30") - spent


def test_the_median_pruner_stops_a_trial_that_falls_behind(make_agent, submit) -> None:
    """lr 0.0001 barely moves the model: measured against a completed trial at lr 0.5, it is
    pruned after its first round and pays for that round only."""
    agents = [make_agent(kind="platform") for _ in range(3)]
    spec = sweep_spec(trials=2, parallel=1, space={"lr": [0.5, 0.0001]}, sampler="random")
    spec["seed"] = _seed_asking(spec, [0.5, 0.0001])
    job = submit(spec=spec, tier="platform", budget="30")
    run_until_idle(agents)
    trials = {t.params["lr"]: t for t in SweepTrial.objects.filter(sweep_id=job["id"])}
    slow, fast = trials[0.0001], trials[0.5]
    assert fast.state == "completed" and fast.job.rounds_done == 3
    assert slow.state == "pruned" and slow.job.status == "stopped"
    assert slow.job.stop_reason == "pruned" and slow.job.rounds_done == 1
    assert "median pruner" in slow.job.error


def test_a_trial_that_cannot_be_submitted_fails_and_the_sweep_goes_on(
    make_agent, submit, buyer
) -> None:
    """Every corner of the space is a valid spec, but a model of two 65,536-wide layers is
    past any tier's cap: that trial fails with the submission's reason, the other runs."""
    agents = [make_agent(kind="platform") for _ in range(3)]
    spec = sweep_spec(trials=2, parallel=1, space={"hidden": [[32], [65536, 65536]]},
                      sampler="random")  # fmt: skip
    spec["seed"] = _seed_asking(spec, ["[65536, 65536]", "[32]"], "hidden")
    job = submit(spec=spec, tier="platform", budget="30")
    run_until_idle(agents)
    failed, ran = SweepTrial.objects.filter(sweep_id=job["id"]).order_by("number")
    assert failed.state == "failed" and failed.job is None and "model" in failed.error
    assert ran.state == "completed"
    detail = buyer.get(f"/api/v1/jobs/{job['id']}/").json()
    assert detail["status"] == "completed" and detail["best_trial"] == 1
    assert detail["trials"][0]["error"] == failed.error


def _seed_asking(data: dict[str, Any], wanted: list[Any], name: str = "lr") -> int:
    """A sweep seed whose sampler asks for `wanted` in this order (the asks are seeded)."""
    from trainer.spec import parse_spec
    from trainer.sweep import COMPLETED, TrialRecord, ask

    sweep = parse_spec(data).sweep
    for seed in range(100):
        records: list[TrialRecord] = []
        for n in range(len(wanted)):
            records.append(TrialRecord(n, ask(sweep, records, seed), COMPLETED, {}, 1.0))
        if [r.params[name] for r in records] == wanted:
            return seed
    raise AssertionError("no seed asks in this order")


def test_sweep_specs_the_marketplace_cannot_run_are_refused(submit, buyer) -> None:
    bad = sweep_spec(space={"batch_size": [32, 0]})
    response = buyer.post("/api/v1/jobs/", {"spec": bad, "budget": "5",
                          "max_price_per_gpu_hour": "1"}, format="json")  # fmt: skip
    assert response.status_code == 400
    fields = [p["field"] for p in response.json()["problems"]]
    assert fields == ["sweep.space.batch_size"], response.json()
    spec = sweep_spec()
    spec["model"]["checkpoint"] = "init.safetensors"
    response = buyer.post("/api/v1/jobs/", {"spec": spec, "budget": "5",
                          "max_price_per_gpu_hour": "1"}, format="json")  # fmt: skip
    assert response.status_code == 400
    assert "model.checkpoint" in [p["field"] for p in response.json()["problems"]]
    assert not Job.objects.exists()


def test_a_paused_sweep_starts_no_trial_until_resumed(make_agent, submit, buyer) -> None:
    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(spec=sweep_spec(trials=2, parallel=1), tier="platform", budget="30")
    sweep = Job.objects.get(pk=job["id"])
    assert buyer.post(f"/api/v1/jobs/{sweep.pk}/pause").status_code == 200
    run_until_idle(agents)  # trial 0 trains on; trial 1 waits for the resume
    assert [t.state for t in sweep.trials.all()] == ["completed"]
    assert buyer.post(f"/api/v1/jobs/{sweep.pk}/resume").status_code == 200
    assert sweep.trials.count() == 2
    run_until_idle(agents)
    assert Job.objects.get(pk=sweep.pk).status == "completed"


def test_cancelling_a_sweep_cancels_its_trials_and_returns_the_budget(submit, buyer) -> None:
    job = submit(spec=sweep_spec(), tier="platform", budget="30")
    sweep = Job.objects.get(pk=job["id"])
    assert sweep.children.count() == 2
    assert buyer.post(f"/api/v1/jobs/{sweep.pk}/cancel").status_code == 200
    assert set(sweep.children.values_list("status", flat=True)) == {"cancelled"}
    assert all(balance(accounts.job_escrow(c)) == 0 for c in sweep.children.all())
    assert balance(accounts.job_escrow(sweep)) == 0
    assert Job.objects.get(pk=sweep.pk).status == "cancelled"


def test_the_job_page_shows_the_trials_table_and_the_best_trial(
    make_agent, submit, make_user
) -> None:
    user, key = make_user("buyer")
    from tests.marketplace.helpers import client_for

    agents = [make_agent(kind="platform") for _ in range(3)]
    job = submit(spec=sweep_spec(), client=client_for(key), tier="platform", budget="30")
    run_until_idle(agents)
    web = Client()
    web.force_login(user)
    page = web.get(f"/jobs/{job['id']}/").content.decode()
    assert 'data-testid="trials"' in page and 'data-testid="best-trial"' in page
    assert "unreadable" not in page  # a sweep has no provenance of its own (its trials do)
    best = Job.objects.get(pk=job["id"]).trials.order_by("value", "number").first()
    assert f"trial #{best.number}</strong>" in page
    for t in SweepTrial.objects.filter(sweep_id=job["id"]):
        assert f'href="/jobs/{t.job_id}/"' in page
    live = web.get(reverse("web:job-live", args=[job["id"]])).json()["trials"]
    assert live["best"] == best.number and len(live["rows"]) == 3
    assert all(row["url"] == f"/jobs/{row['job']}/" for row in live["rows"])
    child = web.get(f"/jobs/{best.job_id}/").content.decode()
    assert 'data-testid="sweep-parent"' in child and f"Trial #{best.number}" in child
