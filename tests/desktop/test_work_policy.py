"""Work policy decisions on hand-built observations."""

from __future__ import annotations

import datetime as dt

from desktop.config import Settings
from desktop.policy import Observations, WorkPolicy, decide, in_window, parse_hhmm

NOON = dt.datetime(2026, 11, 21, 12, 0)


def obs(**kw: object) -> Observations:
    return Observations(now=kw.pop("now", NOON), **kw)  # type: ignore[arg-type]


def test_nothing_in_the_way_allows_work() -> None:
    d = decide(WorkPolicy(), obs(idle_s=0, on_battery=False, gpu_temp_c=50, other_gpu_processes=[]))
    assert d.allowed and str(d) == "allowed"


def test_idle_time() -> None:
    p = WorkPolicy(idle_minutes=10)
    assert not decide(p, obs(idle_s=60)).allowed
    assert "in use" in str(decide(p, obs(idle_s=60)))
    assert decide(p, obs(idle_s=601)).allowed
    assert decide(p, obs(idle_s=None)).allowed  # headless: no owner at a keyboard
    assert decide(WorkPolicy(idle_minutes=0), obs(idle_s=1)).allowed  # "always"


def test_battery() -> None:
    assert not decide(WorkPolicy(), obs(on_battery=True)).allowed
    assert decide(WorkPolicy(work_on_battery=True), obs(on_battery=True)).allowed
    assert decide(WorkPolicy(), obs(on_battery=None)).allowed  # a desktop has no battery


def test_temperature_with_hysteresis() -> None:
    p = WorkPolicy(max_gpu_temp_c=80)
    assert not decide(p, obs(gpu_temp_c=85), working=True).allowed
    assert decide(p, obs(gpu_temp_c=79), working=True).allowed
    # not working yet: must cool to 5 degrees under the limit before starting again
    assert not decide(p, obs(gpu_temp_c=77), working=False).allowed
    assert decide(p, obs(gpu_temp_c=74), working=False).allowed
    assert decide(WorkPolicy(max_gpu_temp_c=None), obs(gpu_temp_c=99)).allowed


def test_schedule_including_overnight() -> None:
    night = WorkPolicy(schedule=(parse_hhmm("22:00"), parse_hhmm("07:00")))
    assert not decide(night, obs()).allowed
    assert "schedule" in str(decide(night, obs()))
    assert decide(night, obs(now=NOON.replace(hour=23))).allowed
    assert decide(night, obs(now=NOON.replace(hour=3))).allowed
    assert in_window(dt.time(9), dt.time(9), dt.time(17)) and not in_window(
        dt.time(17), dt.time(9), dt.time(17)
    )


def test_other_gpu_processes_pause_work() -> None:
    game = obs(other_gpu_processes=[(999999, 2048)])
    d = decide(WorkPolicy(), game)
    assert not d.allowed and "another program uses the GPU" in str(d)
    assert decide(WorkPolicy(pause_on_gpu_processes=False), game).allowed


def test_several_reasons_are_all_reported() -> None:
    d = decide(WorkPolicy(idle_minutes=5), obs(idle_s=1, on_battery=True, gpu_temp_c=95))
    assert len(d.reasons) == 3


def test_policy_from_settings() -> None:
    s = Settings(idle_minutes=3, schedule_start="01:00", schedule_end="05:30", max_gpu_temp_c=70)
    p = WorkPolicy.from_settings(s)
    assert p.idle_minutes == 3 and p.schedule == (dt.time(1), dt.time(5, 30))
    assert p.max_gpu_temp_c == 70
