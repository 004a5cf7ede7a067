"""The `gpuflex` command's buyer side, through the SDK against the real app."""

from __future__ import annotations

import json
import threading
from decimal import Decimal

import httpx
import pytest
from django.core.wsgi import get_wsgi_application
from django.db import connection

from marketplace import cli
from marketplace.client import Client
from marketplace.jobs.models import ACTIVE_STATUSES, Job
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def wired(make_user, monkeypatch) -> str:
    _, key = make_user("buyer")
    transport = httpx.WSGITransport(app=get_wsgi_application())
    monkeypatch.setattr(
        cli, "build_client", lambda args: Client("http://testserver", key, transport=transport)
    )
    return key


def one_line_error(capsys) -> str:
    """What the command printed on stderr, checked to be a message, not a traceback."""
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out and "Error:" not in out.err, out.err
    # (the in-process server's own log lines go to stderr too; the command says one line)
    ours = [line for line in out.err.splitlines() if line.startswith("gpuflex")]
    assert len(ours) == 1, out.err
    return ours[0]


def work_in_background(agents) -> threading.Thread:
    """Nodes that pick up the job once it exists, while the CLI follows it."""

    def run() -> None:
        try:
            for agent in agents:
                task = None
                for _ in range(200):
                    if (task := agent.claim(wait=0.1)) is not None:
                        break
                assert task is not None and agent.work(task).status_code == 202
        except BaseException:
            Job.objects.update(status="cancelled")  # ends the CLI's follow; the test fails
            raise
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_submit_follow_jobs_download(wired, make_agent, tmp_path, capsys) -> None:
    import yaml

    agents = [make_agent(kind="platform") for _ in range(3)]
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(SMALL_SPEC | {"rounds": {"max_rounds": 1}}))
    thread = work_in_background(agents)
    assert (
        cli.main(
            [
                "submit",
                str(spec),
                "--budget",
                "10",
                "--tier",
                "platform",
                "--follow",
                "--interval",
                "0.2",
            ]
        )
        == 0
    )
    thread.join(timeout=60)
    out = capsys.readouterr()
    job_id = out.out.split()[1]
    assert f"{job_id}: completed after 1 round(s)" in out.out
    assert "round" in out.err  # the tqdm progress bar
    assert cli.main(["jobs"]) == 0
    listing = capsys.readouterr().out
    assert job_id in listing and "completed" in listing and "1/1" in listing
    assert cli.main(["download", job_id, "-o", str(tmp_path)]) == 0
    assert (tmp_path / f"{job_id}.safetensors").stat().st_size > 0
    assert json.loads((tmp_path / f"{job_id}.provenance.json").read_text())["records"]


def test_errors_are_one_readable_line(wired, tmp_path, capsys) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\noptimizer: {lr: -1}\n")
    assert cli.main(["submit", str(spec), "--budget", "10"]) == 2
    err = capsys.readouterr().err
    assert "optimizer.lr" in err and "invalid_spec" in err


def test_submit_an_inference_job_with_a_checkpoint_and_download_its_predictions(
    wired, make_agent, tmp_path, capsys
) -> None:
    import pyarrow.parquet as pq
    import safetensors.torch
    import yaml

    from trainer.models import build_model
    from trainer.spec import ModelSpec

    weights = tmp_path / "mine.safetensors"
    weights.write_bytes(safetensors.torch.save(
        build_model(ModelSpec(hidden=[16]), (64,), 10, seed=7).state_dict()
    ))  # fmt: skip
    spec = tmp_path / "predict.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "predict", "kind": "inference", "dataset": {"kind": "digits"},
        "model": {"arch": "mlp", "hidden": [16], "checkpoint": "mine.safetensors"},
        "sharding": {"num_shards": 3},
    }))  # fmt: skip
    thread = work_in_background([make_agent(kind="platform") for _ in range(3)])
    argv = ["submit", str(spec), "--checkpoint", str(weights), "--budget", "10", "--tier",
            "platform", "--follow", "--interval", "0.2"]  # fmt: skip
    assert cli.main(argv) == 0
    thread.join(timeout=60)
    out = capsys.readouterr().out
    job_id = out.split()[1]
    assert "(predict, inference)" in out and '"rows": 1797' in out
    target = tmp_path / "p.parquet"
    assert cli.main(["predictions", job_id, "-o", str(target)]) == 0
    assert pq.read_table(target).column("row").to_pylist() == list(range(1797))
    assert cli.main(["jobs"]) == 0
    assert "inference" in capsys.readouterr().out


def test_missing_files_are_named_before_anything_is_sent(wired, tmp_path, capsys) -> None:
    import yaml

    gone = tmp_path / "does-not-exist.yaml"
    assert cli.main(["submit", str(gone), "--budget", "1"]) == 2
    assert f"the spec file {gone} does not exist" in one_line_error(capsys)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(SMALL_SPEC))
    assert cli.main(["submit", str(spec), "--dataset", "/nonexistent.csv", "--budget", "1"]) == 2
    assert "the --dataset file /nonexistent.csv does not exist" in one_line_error(capsys)
    csv_spec = tmp_path / "rows.yaml"
    csv_spec.write_text(
        yaml.safe_dump(SMALL_SPEC | {"dataset": {"kind": "csv", "path": "rows.csv"}})
    )
    assert cli.main(["submit", str(csv_spec), "--budget", "1"]) == 2
    err = one_line_error(capsys)
    assert "dataset.path names 'rows.csv'" in err and str(tmp_path / "rows.csv") in err
    assert "--dataset FILE" in err
    assert cli.main(["upload", str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv does not exist" in one_line_error(capsys)
    assert not Job.objects.exists()


def test_the_server_names_the_dataset_a_spec_wants(wired) -> None:
    spec = SMALL_SPEC | {"dataset": {"kind": "csv", "path": "rows.csv"}}
    r = Client("http://testserver", wired, transport=httpx.WSGITransport(
        app=get_wsgi_application()))._http.post(
        "jobs/", json={"spec": spec, "budget": "1"})  # fmt: skip
    assert r.status_code == 400 and "dataset.path names 'rows.csv'" in r.json()["detail"]


def test_an_unreachable_marketplace_is_named_with_how_to_point_elsewhere(
    monkeypatch, capsys
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        assert cli.main(["--server", url, "jobs"]) == 2
        err = one_line_error(capsys)
        assert f"cannot reach the marketplace at {url}" in err
        assert "--server URL" in err and "GPUFLEX_SERVER" in err
        monkeypatch.setenv("GPUFLEX_SERVER", url + "/")
        assert cli.main(["jobs", "cancel", "abcd1234"]) == 2
        assert f"at {url} (" in one_line_error(capsys)


# a child `gpuflex jobs` with thousands of jobs, its output read by something like `head -1`
JOBS_CHILD = """
import sys, httpx
from marketplace import cli
from marketplace.client import Client
rows = [{"id": f"{i:08x}-0000-4000-8000-000000000000", "kind": "train", "status": "completed",
         "rounds_done": 1, "max_rounds": 1, "last_metrics": {}, "privacy": None, "name": "j"}
        for i in range(5000)]
answer = httpx.Response(200, json={"count": len(rows), "next": None, "results": rows})
transport = httpx.MockTransport(lambda request: answer)
cli.build_client = lambda args: Client("http://x", "k", transport=transport)
sys.exit(cli.main(["jobs"]))
"""


def test_a_closed_pipe_ends_the_listing_quietly() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", JOBS_CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().startswith(b"id")
    child.stdout.close()  # `head -1` has its line and goes: the listing's next write fails
    _, err = child.communicate(timeout=120)
    assert child.returncode == 141, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err and err == b"", err


def test_jobs_cancel_pause_resume_take_the_short_id_the_web_shows(wired, capsys) -> None:
    from tests.marketplace.helpers import client_for

    buyer = client_for(wired)
    made = []
    # submitted until two ids share their first digit (at most 17: 16 hex digits), so that
    # one digit is a prefix of several
    while len({m[0] for m in made}) == len(made):
        r = buyer.post("/api/v1/jobs/", {"spec": SMALL_SPEC, "budget": "1"}, format="json")
        assert r.status_code == 201, r.content
        made.append(r.json()["id"])
    job_id = made[-1]
    short = job_id[:8]
    for action, status in (("pause", "paused"), ("resume", "running"), ("cancel", "cancelled")):
        assert cli.main(["jobs", action, short]) == 0
        assert capsys.readouterr().out.strip().startswith(f"{job_id}: {status}")
        assert Job.objects.get(pk=job_id).status == status
    assert cli.main(["jobs", "resume", job_id]) == 2  # a cancelled job: the server's 409
    assert "409" in one_line_error(capsys)
    assert cli.main(["jobs", "cancel", "0ff0ff0f"]) == 2 or made[0].startswith("0ff0ff0f")
    assert "none of your jobs has an id starting with '0ff0ff0f'" in one_line_error(capsys)
    assert cli.main(["download", job_id[0]]) == 2
    err = one_line_error(capsys)
    assert f"'{job_id[0]}' starts the ids of several of your jobs" in err and "ambiguous_id" in err
    assert cli.main(["jobs", "pause", "not-hex!"]) == 2
    assert "id_prefix" in one_line_error(capsys)


def test_submit_without_a_price_takes_the_markets(wired, make_agent, tmp_path, capsys) -> None:
    import yaml

    for price in ("1.20", "2.00"):
        make_agent(price=price)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(SMALL_SPEC))
    assert cli.main(["submit", str(spec), "--budget", "1"]) == 0
    out = capsys.readouterr().out
    assert "max price 1.6000 per GPU-hour: the market's median" in out
    assert Job.objects.get().max_price_per_gpu_hour == Decimal("1.6")


def test_follow_says_why_no_node_takes_the_job(wired, make_agent, tmp_path, capsys) -> None:
    import yaml

    from marketplace.jobs.services import cancel_job

    make_agent(price="1.20")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(SMALL_SPEC))

    def cancel_once_told() -> None:  # the buyer reads the reason and gives up
        try:
            for _ in range(600):
                job = Job.objects.filter(status__in=ACTIVE_STATUSES).first()
                if job is not None:
                    cancel_job(job)
                    return
                threading.Event().wait(0.1)
        finally:
            connection.close()

    thread = threading.Thread(target=cancel_once_told, daemon=True)
    thread.start()
    argv = ["submit", str(spec), "--budget", "1", "--max-price", "1.00", "--follow",
            "--interval", "0.2"]  # fmt: skip
    assert cli.main(argv) == 1
    thread.join(timeout=60)
    out = capsys.readouterr()
    said = out.out + out.err
    assert "no node online at or under 1.00; the cheapest that fits asks 1.20" in said
