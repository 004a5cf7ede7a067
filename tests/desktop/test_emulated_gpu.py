"""The bench's emulated GPU of a fixed speed (desktop.emulated_gpu): a task's compute takes
the time its work fixes, not a multiple of what a loaded host made it take."""

from __future__ import annotations

import pytest

from desktop import emulated_gpu as eg

TASK = {"batch_size": 10, "spec": {"local": {"batch_size": 32, "grad_accum_steps": 2}}}


@pytest.mark.parametrize(("raw", "value"), [(None, 0.0), ("", 0.0), ("0.02", 0.02), ("0", 0.0)])
def test_the_sample_time_comes_from_the_environment(raw: str | None, value: float) -> None:
    env = {} if raw is None else {eg.SAMPLE_S_ENV: raw}
    assert eg.sample_s(env) == value


@pytest.mark.parametrize("raw", ["fast", "-1", "nan", "inf"])
def test_a_senseless_sample_time_is_refused_by_name(raw: str) -> None:
    with pytest.raises(eg.BadEmulation, match=eg.SAMPLE_S_ENV):
        eg.sample_s({eg.SAMPLE_S_ENV: raw})


def test_the_work_is_steps_times_the_tasks_batch_times_accumulation() -> None:
    assert eg.samples_trained(TASK, {"steps": 10.0}) == 10 * 10 * 2
    # a task naming no batch size trains on the spec's
    assert eg.samples_trained({"spec": {"local": {"batch_size": 32}}}, {"steps": 3}) == 96
    assert eg.samples_trained({}, {"steps": 3}) == 0
    assert eg.step_s(TASK, 0.01) == pytest.approx(0.2)


def test_the_agent_waits_out_what_real_compute_did_not_take() -> None:
    """The emulated time is fixed by the work: a loaded host's slower real compute shortens
    the wait instead of lengthening the task (`--compute-scale` multiplied it)."""
    emulated = 0.01 * eg.samples_trained(TASK, {"steps": 10})  # 2 s
    assert eg.hold_s(0.5, emulated) == pytest.approx(1.5)
    assert eg.hold_s(1.5, emulated) == pytest.approx(0.5)  # contention: 3x slower, same end
    assert eg.hold_s(3.0, emulated) == 0.0  # real compute past it is reported as it was
