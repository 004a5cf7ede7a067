"""Differential privacy: clipping and noising an update on its node, the privacy accounting
(Opacus's RDP accountant: none of the privacy math is ours), and the check that a noisy
update carries the noise its job promised.

Two levels (docs/privacy.md):

- **update** (user-level DP-FedAvg): a task's whole update is clipped to `clip_norm` and gets
  Gaussian noise of standard deviation `noise_multiplier x clip_norm`, on the node, drawn
  from the operating system's CSPRNG (`os.urandom`), never from a seed the server knows. The
  "user" is a shard of the job's data (a silo, for a federated job): all of it is protected
  together. Every update is noised on its own because the server sees each one (there is no
  secure aggregation yet): the guarantee holds against the coordinator too, at the price of
  more noise in the average than a trusted server would add (the mean's noise falls as one
  over the square root of the updates averaged, not one over their number).
- **sample** (DP-SGD): Opacus clips each example's gradient to `clip_norm` and noises every
  local step; the accountant composes a shard's steps over all rounds.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

from trainer.spec import JobSpec, PrivacySpec

# the noise check's tolerance, in standard deviations of the sample variance's estimate: an
# honest update fails it about once in 10^9 draws (6 sigma), a node that skips the noise or
# scales it down by 20 % fails it at once for any model of more than a few thousand weights
NOISE_CHECK_SIGMAS = 6.0
# Rényi orders the accountant tries: Opacus's defaults stop at 63, and a job with much noise
# over few releases (large noise multipliers, every shard every round) is bounded tightest
# at higher orders; more orders only ever tighten the bound. Opacus (and the SciPy under it,
# some 65 MB and 2 s to import) is imported by the accountant's functions only: a
# contributor's task runner noises updates with torch alone (privatize_update).
HIGH_ALPHAS = [*range(64, 256, 4), *range(256, 1025, 32)]


@functools.cache  # rounds_within asks epsilon_after a dozen times a plan
def _alphas() -> list[float]:
    from opacus.accountants import RDPAccountant

    return [*RDPAccountant.DEFAULT_ALPHAS, *HIGH_ALPHAS]


def csprng_normal(shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Standard normal samples from os.urandom (Box-Muller over 32-bit uniforms).

    Float noise leaks a little through its low bits (Mironov, CCS 2012): the update is sent as
    float32 or coarser, which rounds most of that away; snapping is not done here.
    """
    n = math.prod(shape)
    pairs = (n + 1) // 2
    raw = torch.frombuffer(bytearray(os.urandom(8 * pairs)), dtype=torch.int32).double()
    # uniforms in (0, 1]: never 0, whose log is -inf
    u = (raw + 2.0**31 + 1.0) / 2.0**32
    u1, u2 = u[:pairs], u[pairs:]
    radius = torch.sqrt(-2.0 * torch.log(u1))
    z = torch.cat([radius * torch.cos(2 * math.pi * u2), radius * torch.sin(2 * math.pi * u2)])
    return z[:n].reshape(shape).to(dtype)


def update_norm(delta: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in delta.values()))


def clip_update(delta: dict[str, torch.Tensor], clip_norm: float) -> dict[str, torch.Tensor]:
    scale = min(1.0, clip_norm / max(update_norm(delta), 1e-12))
    return {k: t * scale for k, t in delta.items()}


def privatize_update(
    delta: dict[str, torch.Tensor], privacy: PrivacySpec
) -> dict[str, torch.Tensor]:
    """Clip the whole update, then (update level) add CSPRNG Gaussian noise to it. Sample-level
    jobs were noised step by step during training: only the clip applies, bounding what any
    one shard moves the model."""
    if privacy.clip_norm is None:
        return delta
    clipped = clip_update(delta, privacy.clip_norm)
    sigma = privacy.noise_multiplier * privacy.clip_norm
    if privacy.mode == "sample" or sigma == 0:
        return clipped
    return {k: t + csprng_normal(t.shape, t.dtype) * sigma for k, t in clipped.items()}


def noise_problem(delta: dict[str, torch.Tensor], privacy: PrivacySpec) -> str | None:
    """Why an update-level noisy update does not carry its job's noise, or None.

    The server cannot see the noise, only its effect: an update that is clipped to C and then
    noised with N(0, s^2) per coordinate has a mean square between s^2 and s^2 + C^2/d. An
    update that skipped the noise (or shrank it, to push its own direction harder) falls
    below; one that skipped the clip, above. The band is NOISE_CHECK_SIGMAS standard
    deviations of the mean square's estimate wide on each side.
    """
    if privacy.mode != "update" or privacy.clip_norm is None or privacy.noise_multiplier == 0:
        return None
    d = sum(t.numel() for t in delta.values())
    sigma = privacy.noise_multiplier * privacy.clip_norm
    mean_square = update_norm(delta) ** 2 / d
    # the sample variance of d normal draws has standard deviation s^2 sqrt(2 / d)
    spread = NOISE_CHECK_SIGMAS * sigma**2 * math.sqrt(2.0 / d)
    low = sigma**2 - spread
    high = sigma**2 + privacy.clip_norm**2 / d + spread
    if mean_square < low:
        return (
            f"the update carries less noise than its job's privacy asks (mean square "
            f"{mean_square:.3g}, at least {low:.3g} expected for noise {sigma:.3g})"
        )
    if mean_square > high:
        return (
            f"the update is larger than a clipped, noised one can be (mean square "
            f"{mean_square:.3g}, at most {high:.3g} for clip {privacy.clip_norm:g})"
        )
    return None


# -- accounting ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How one round composes, for the accountant: `steps` Gaussian mechanisms of
    `noise_multiplier`, each on a fraction `sample_rate` of the protected unit."""

    noise_multiplier: float
    sample_rate: float
    steps_per_round: int


def round_plan(spec: JobSpec, shard_rows: int, noise_multiplier: float | None = None) -> Plan:
    """Update level: one release of each shard's update per round, every shard every round
    (sample rate 1: no amplification is claimed for shards a round leaves out). Sample level:
    the shard's local steps, each on a batch drawn from its `shard_rows` rows."""
    p = spec.privacy
    z = p.noise_multiplier if noise_multiplier is None else noise_multiplier
    if p.mode == "update":
        return Plan(z, 1.0, 1)
    rate = min(1.0, spec.local.batch_size / max(shard_rows, 1))
    return Plan(z, rate, max(spec.local.steps or 1, 1))


def epsilon_after(plan: Plan, rounds: int, delta: float) -> float:
    """ε spent after `rounds` rounds (Opacus's RDP accountant)."""
    if rounds <= 0 or plan.noise_multiplier <= 0:
        return 0.0 if rounds <= 0 else math.inf
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(plan.noise_multiplier, plan.sample_rate, plan.steps_per_round * rounds)]
    return float(accountant.get_epsilon(delta, alphas=_alphas()))


def noise_for_budget(plan: Plan, rounds: int, epsilon: float, delta: float) -> float:
    """The smallest noise multiplier that keeps `rounds` rounds within (ε, δ)."""
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=plan.sample_rate,
            steps=plan.steps_per_round * rounds,
            accountant="rdp",
            epsilon_tolerance=0.01 * epsilon,
            alphas=_alphas(),
        )
    )


def rounds_within(plan: Plan, epsilon: float, delta: float, limit: int) -> int:
    """How many rounds fit in the budget (at most `limit`): the job stops before the next
    round would exceed it."""
    lo, hi = 0, limit
    while lo < hi:  # ε grows with rounds: the last round count still within the budget
        mid = (lo + hi + 1) // 2
        if epsilon_after(plan, mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid - 1
    return lo


def with_budget_noise(spec: JobSpec, shard_rows: int) -> JobSpec:
    """The spec with the noise multiplier that keeps `rounds.max_rounds` rounds within its
    target ε, when it names a target and no noise; as it is otherwise. The marketplace
    stores this at submission and the simulator runs it, so both train with the same noise.
    ValueError when no noise reaches the target."""
    p = spec.privacy
    if p.epsilon is None or p.noise_multiplier > 0 or p.clip_norm is None:
        return spec
    plan = round_plan(spec, shard_rows)
    z = noise_for_budget(plan, spec.rounds.max_rounds, p.epsilon, p.delta)
    return spec.replace(privacy=p.model_copy(update={"noise_multiplier": round(z, 6)}))
