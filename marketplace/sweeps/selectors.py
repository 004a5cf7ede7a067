"""Reads of a sweep's trials: the study's records, the trials table, the best trial."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from marketplace.jobs.models import Job
from marketplace.ledger.selectors import job_costs
from marketplace.sweeps.models import SweepTrial

if TYPE_CHECKING:
    from trainer import sweep as study


def records(sweep: Job) -> list[study.TrialRecord]:
    from trainer import sweep as study

    return [
        study.TrialRecord(
            t.number,
            dict(t.params),
            t.state,
            {int(k): float(v) for k, v in t.intermediate.items()},
            t.value,
        )
        for t in SweepTrial.objects.filter(sweep=sweep).order_by("number")
    ]


def best_trial(sweep: Job) -> SweepTrial | None:
    """The completed trial with the best value; None before one completes."""
    from trainer import sweep as study

    spec = sweep.parsed_spec.sweep
    best = study.best(spec, records(sweep)) if spec else None
    return None if best is None else SweepTrial.objects.get(sweep=sweep, number=best.number)


def trial_rows(sweep: Job) -> list[dict[str, Any]]:
    """The trials table (API, CLI, web): number, params, state, rounds, value, cost."""
    rows = []
    for t in SweepTrial.objects.filter(sweep=sweep).select_related("job").order_by("number"):
        child = t.job
        rows.append(
            {
                "number": t.number,
                "job": str(child.pk) if child else None,
                "params": t.params,
                "state": t.state,
                "rounds": child.rounds_done if child else 0,
                "value": t.value,
                "cost": str(job_costs(child).spent) if child else "0",
                "error": t.error,
            }
        )
    return rows
