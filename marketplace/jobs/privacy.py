"""A private job's budget: the noise set at submission, ε spent after each round, and the stop
before a round would spend more than the buyer allowed (docs/privacy.md).

The accounting is Opacus's (trainer/privacy.py). The unit protected is a shard of the job's
data (a silo for a federated job): every shard is counted in every round, so no
amplification by subsampling is claimed for shards a round leaves out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models import Min

from trainer.spec import JobSpec

if TYPE_CHECKING:
    from trainer.privacy import Plan

# torch and Opacus are imported where the accounting runs (the worker, a job's round), not
# here: a web request shows a job's privacy summary without them (issue 36)


def settle_noise(
    spec: JobSpec, input_shape: tuple[int, ...], num_classes: int, shard_rows: int | None
) -> tuple[JobSpec, list[tuple[str, str]]]:
    """The spec as it is stored, with the noise that keeps `rounds.max_rounds` rounds within
    a target `privacy.epsilon` when the buyer gave none; and what makes it unusable.
    `shard_rows`: the smallest shard's rows, None for a federated job (silos unknown)."""
    import torch

    from trainer.dp_sgd import DPUnsupported, check_model
    from trainer.models import build_model
    from trainer.privacy import epsilon_after, round_plan, with_budget_noise

    p = spec.privacy
    if p.clip_norm is None:
        return spec, []
    problems: list[tuple[str, str]] = []
    if p.mode == "sample":
        if shard_rows is None and p.epsilon is not None:
            reason = ("a federated job's silo sizes are unknown, so its sample-level ε cannot "
                      "be accounted; use mode 'update'")  # fmt: skip
            return spec, [("privacy.mode", reason)]
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = build_model(spec.model, input_shape, num_classes)
        try:
            check_model(model)
        except DPUnsupported as exc:
            problems.append(("privacy.mode", str(exc)))
    if p.epsilon is None or problems:
        return spec, problems
    if p.noise_multiplier == 0:
        try:
            return with_budget_noise(spec, shard_rows or 1), []
        except ValueError as exc:  # Opacus: no noise multiplier it tried reaches the target
            rounds = spec.rounds.max_rounds
            return spec, [("privacy.epsilon", f"unreachable for {rounds} rounds: {exc}")]
    first = epsilon_after(round_plan(spec, shard_rows or 1), 1, p.delta)
    if first > p.epsilon:
        return spec, [(
            "privacy.epsilon",
            f"one round with noise_multiplier {p.noise_multiplier:g} already spends "
            f"ε = {first:.3g} (> {p.epsilon:g}); raise the noise or leave it out to have "
            "it computed",
        )]  # fmt: skip
    return spec, []


def job_plan(job: Any) -> Plan:
    from trainer.privacy import round_plan

    spec = job.parsed_spec
    rows = job.shards.aggregate(m=Min("size"))["m"]
    return round_plan(spec, rows or 1)


def spent_after(job: Any, rounds: int) -> float | None:
    """ε spent once `rounds` rounds are done; None for a job that promises no privacy."""
    from trainer.privacy import epsilon_after

    p = job.parsed_spec.privacy
    if not p.private or p.clip_norm is None:
        return None
    return epsilon_after(job_plan(job), rounds, p.delta)


def privacy_stop_reason(job: Any) -> str:
    """Why the job must stop before its next round ("" if it may go on): that round would
    spend more than its ε."""
    from trainer.privacy import epsilon_after

    p = job.parsed_spec.privacy
    if p.epsilon is None or p.clip_norm is None:
        return ""
    plan = job_plan(job)  # one query for the shards' sizes
    after_next = epsilon_after(plan, job.rounds_done + 1, p.delta)
    if after_next <= p.epsilon:
        return ""
    spent = epsilon_after(plan, job.rounds_done, p.delta)
    return (
        f"Privacy budget reached: {job.rounds_done} rounds spent ε = {spent:.3g} of "
        f"{p.epsilon:g} (δ = {p.delta:g}); another round would spend {after_next:.3g}."
    )


def privacy_summary(job: Any) -> dict[str, Any] | None:
    """What the API, the job page and `gpuflex jobs` show of a private job."""
    p = job.parsed_spec.privacy
    if not p.private or p.clip_norm is None:
        return None
    return {
        "mode": p.mode,
        "clip_norm": p.clip_norm,
        "noise_multiplier": p.noise_multiplier,
        "epsilon": p.epsilon,
        "delta": p.delta,
        "epsilon_spent": job.privacy_epsilon_spent,
    }
