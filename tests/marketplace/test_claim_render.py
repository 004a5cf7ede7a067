"""A claim's reply rendered with each job's spec once (api/claim_render.py) is DRF's
JSONRenderer's rendering of it, byte for byte, whatever the specs hold."""

from __future__ import annotations

import copy
import uuid
from decimal import Decimal

from rest_framework.renderers import JSONRenderer

from marketplace.api import claim_render

SPEC = {
    "name": 'ünïcode \u2028 line \u2029 sep "quoted" \\ back',
    "model": {"arch": "mlp", "hidden": [128, 64], "dropout": 0.0},
    "privacy": {"delta": 1e-05, "epsilon": None, "flag": True},
    "price": Decimal("1.50"),
}


def _task(job: str, spec: dict, n: int) -> dict:
    deadline = "2026-11-29T18:23:30.525139Z"
    return {"id": str(uuid.uuid4()), "job_id": job, "round": 1, "spec": spec, "steps": n,
            "deadline": deadline, "model_source": {"kind": "full"}}  # fmt: skip


def _reply(tasks: list[dict]) -> dict:
    return {"task": tasks[0], "tasks": tasks}


def _whole(data: dict) -> bytes:
    return JSONRenderer().render(data, "application/json")


def test_a_reply_of_two_jobs_renders_as_drf_renders_it_each_spec_once(monkeypatch) -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    other = copy.deepcopy(SPEC) | {"name": "another"}
    data = _reply([_task(a, SPEC, 1), _task(b, other, 2), _task(a, SPEC, 3), _task(b, other, 4)])
    rendered: list[object] = []
    render = claim_render._RENDERER.render
    monkeypatch.setattr(
        claim_render._RENDERER,
        "render",
        lambda d, *a, **k: rendered.append(d) or render(d, *a, **k),
    )
    assert claim_render.render(data) == _whole(data)
    assert (
        sum(1 for d in rendered if d is SPEC) == 1 and sum(1 for d in rendered if d is other) == 1
    )


def test_a_spec_holding_a_token_is_rendered_whole() -> None:
    job = str(uuid.uuid4())
    sneaky = SPEC | {"name": claim_render._token(job)}
    data = _reply([_task(job, sneaky, 1), _task(job, sneaky, 2)])
    assert claim_render.render(data) == _whole(data)
    elsewhere = _task(job, SPEC, 1) | {"model_source": {"kind": claim_render._token(job)}}
    data = _reply([elsewhere, _task(job, SPEC, 2)])
    assert claim_render.render(data) == _whole(data)


def test_tasks_of_one_job_with_different_specs_are_rendered_whole() -> None:
    job = str(uuid.uuid4())
    data = _reply([_task(job, SPEC, 1), _task(job, SPEC | {"name": "changed"}, 2)])
    assert claim_render.render(data) == _whole(data)


def test_what_is_not_a_claim_reply_is_rendered_whole() -> None:
    job = str(uuid.uuid4())
    for data in (
        {"tasks": [_task(job, SPEC, 1)]},  # no "task"
        {"task": None, "tasks": [_task(job, SPEC, 1)]},
        _reply([{"id": "x", "job_id": job}]),  # no spec
        {"detail": "nothing"},
    ):
        assert claim_render.render(data) == _whole(data)
