"""Running a sweep (`kind: sweep`): trials as child training jobs, Optuna deciding.

One step (`advance_sweep`, a Celery task sent on commit whenever a trial's round closes or a
trial ends, and at the sweep's start) does everything under the sweep's row lock:

1. a trial's closed round: its objective value is recorded, and the median pruner, asked of
   a study rebuilt from the trial rows (trainer.sweep), may stop the trial (stop_reason
   "pruned"): it has paid for its rounds only, and its unspent escrow returns to the sweep's;
2. trials whose jobs ended take their state and final value;
3. while fewer than `sweep.parallel` trials run and the `sweep.trials` budget is not used up,
   TPE proposes the next parameters and the trial is submitted as an ordinary training job
   (jobs.submission, with the sweep as its parent), funded with an equal share of what is
   left in the sweep's escrow;
4. once every trial has ended, the sweep completes with the best trial's model.

Every step re-reads the rows, so a step that runs twice, or late, decides the same.
"""

from __future__ import annotations

import logging
from decimal import ROUND_DOWN, Decimal

from django.db import transaction
from django.utils import timezone

from marketplace.events.services import job_changed
from marketplace.jobs.errors import MarketplaceError
from marketplace.jobs.models import Job, JobStatus
from marketplace.jobs.services import stop_job
from marketplace.jobs.submission import submit_job
from marketplace.ledger import accounts
from marketplace.ledger.posting import balance
from marketplace.ledger.services import release_escrow
from marketplace.rounds.models import Round, RoundStatus
from marketplace.sweeps.models import SweepTrial, TrialState
from marketplace.sweeps.selectors import records
from trainer.spec import SpecError
from trainer.sweep_space import SweepSpec

log = logging.getLogger(__name__)

PRUNED = "pruned"  # a pruned trial's stop_reason


def advance_sweep(sweep_id: object, child_id: object = None, round_number: int = 0) -> None:
    with transaction.atomic():
        sweep = Job.objects.select_for_update(no_key=True).filter(pk=sweep_id).first()
        if sweep is None or sweep.kind != "sweep":
            return
        if child_id and round_number:
            _record_round(sweep, child_id, round_number)
        _sync_ended(sweep)
        if sweep.status == JobStatus.RUNNING:  # a paused sweep starts no new trial
            _start_trials(sweep)
            _maybe_finish(sweep)
        job_changed(sweep.pk)


def _sweep_spec(sweep: Job) -> SweepSpec:
    spec = sweep.parsed_spec.sweep
    assert spec is not None
    return spec


def _record_round(sweep: Job, child_id: object, number: int) -> None:
    from trainer import sweep as study

    trial = (
        SweepTrial.objects.select_for_update(no_key=True)
        .filter(sweep=sweep, job_id=child_id)
        .first()
    )
    rnd = Round.objects.filter(job_id=child_id, number=number, status=RoundStatus.DONE).first()
    if trial is None or rnd is None:
        return
    spec = _sweep_spec(sweep)
    value = study.round_value(spec, rnd.metrics)
    if value is None:
        return
    trial.intermediate = {**trial.intermediate, str(number): value}
    trial.save(update_fields=["intermediate", "updated_at"])
    if trial.state != TrialState.RUNNING or not sweep.is_active:
        return
    child = Job.objects.select_for_update(no_key=True).get(pk=child_id)
    if child.is_active and study.should_prune(spec, records(sweep), trial.number):
        why = f"pruned by the sweep's median pruner after round {number}"
        stop_job(child, f"{why} (trial #{trial.number} of sweep {sweep.name})", PRUNED)


def _sync_ended(sweep: Job) -> None:
    """Running trials whose job ended take its outcome."""
    from trainer import sweep as study

    spec = _sweep_spec(sweep)
    running = SweepTrial.objects.select_for_update(no_key=True).filter(
        sweep=sweep, state=TrialState.RUNNING, job__isnull=False
    )
    for trial in running.select_related("job"):
        child = trial.job
        assert child is not None
        if child.is_active:
            continue
        if child.status == JobStatus.COMPLETED:
            last = Round.objects.filter(job=child, status=RoundStatus.DONE).order_by("-number")
            metrics = last.first().metrics if last.exists() else {}  # type: ignore[union-attr]
            trial.state = TrialState.COMPLETED
            trial.value = study.final_value(
                spec, rounds_done=child.rounds_done, reached_target=child.reached_target,
                max_rounds=child.max_rounds, last_metrics=metrics,
            )  # fmt: skip
        elif child.stop_reason == PRUNED:
            trial.state = TrialState.PRUNED
        else:
            trial.state, trial.error = TrialState.FAILED, child.error or child.status
        trial.save(update_fields=["state", "value", "error", "updated_at"])


def _share(sweep: Job, left: int) -> Decimal:
    """An equal share, for each trial still to start, of what the sweep's escrow holds."""
    held = balance(accounts.job_escrow(sweep))
    return (held / left).quantize(Decimal("0.0001"), rounding=ROUND_DOWN) if left else Decimal(0)


def _start_trials(sweep: Job) -> None:
    from trainer import sweep as study

    spec = _sweep_spec(sweep)
    trials = SweepTrial.objects.filter(sweep=sweep)
    while True:
        started = trials.count()
        running = trials.filter(state=TrialState.RUNNING).count()
        if started >= spec.trials or running >= spec.parallel:
            return
        budget = _share(sweep, spec.trials - started)
        if budget <= 0:
            return
        params = study.ask(spec, records(sweep), sweep.parsed_spec.seed)
        trial = SweepTrial(sweep=sweep, number=started, params=params)
        try:
            trial_spec = study.trial_spec(sweep.parsed_spec, params, started)
            trial.job = submit_job(
                buyer=sweep.buyer, spec_data=trial_spec.to_dict(), tier=sweep.tier,
                budget=budget, max_price_per_gpu_hour=sweep.max_price_per_gpu_hour,
                parent=sweep,
            )  # fmt: skip
        except (SpecError, MarketplaceError) as exc:
            # this trial's parameters cannot run (a model too large for the budget's cap,
            # say): it counts against the budget as failed, and the sweep goes on
            log.warning("sweep %s trial %s not submitted: %s", sweep.pk, started, exc)
            trial.state, trial.error = TrialState.FAILED, str(exc)[:2000]
        trial.save()


def _maybe_finish(sweep: Job) -> None:
    """Every trial started has ended, and no more will start: the sweep completes with the
    best trial's model, or fails when no trial completed."""
    from trainer import sweep as study

    spec = _sweep_spec(sweep)
    trials = SweepTrial.objects.filter(sweep=sweep)
    if trials.filter(state=TrialState.RUNNING).exists():
        return
    started = trials.count()
    if started < spec.trials and _share(sweep, spec.trials - started) > 0:
        return
    best = study.best(spec, records(sweep))
    now = timezone.now()
    if best is None:
        sweep.status, sweep.finished_at = JobStatus.FAILED, now
        sweep.error = f"none of the {started} trials completed"
        sweep.stop_reason = sweep.error
    else:
        child = trials.get(number=best.number).job
        assert child is not None
        sweep.status, sweep.finished_at = JobStatus.COMPLETED, now
        sweep.model_file, sweep.model_hash = child.model_file, child.model_hash
        sweep.rounds_done, sweep.reached_target = child.rounds_done, child.reached_target
        sweep.stop_reason = (
            f"{started} trials run; best: trial #{best.number} ({spec.objective} {best.value:g})"
        )
    sweep.save()
    release_escrow(sweep)
