"""The server's own byte counters (NodeTraffic): what the agent endpoints send and receive,
per node and job, and the demo summary's traffic and utilization read from them."""

from __future__ import annotations

import gzip

import pytest

from marketplace.demo.summary import print_summary, summarize
from marketplace.jobs.models import Job
from marketplace.nodes.models import Node, NodeTraffic
from marketplace.nodes.selectors import job_traffic
from marketplace.rounds.models import Round, TaskResult
from tests.marketplace.helpers import SMALL_SPEC

pytestmark = pytest.mark.django_db(transaction=True)


def traffic(agent, job_id) -> tuple[int, int]:
    row = NodeTraffic.objects.filter(node_id=agent.node_id, job_id=job_id).first()
    return (row.bytes_up, row.bytes_down) if row else (0, 0)


def test_counters_equal_the_bodies_sent_and_received(make_agent, submit) -> None:
    agent, other = make_agent(kind="platform"), make_agent(kind="platform")
    job = submit(tier="platform")
    task = agent.claim()
    assert traffic(agent, job["id"]) == (0, 0)  # a claim moves no model or data

    model, shard = agent.model(task["id"]), agent.shard(task["id"])
    assert model.status_code == shard.status_code == 200
    down = len(model.content) + len(shard.content)
    assert traffic(agent, job["id"]) == (0, down)
    agent.model(task["id"])  # a second download is sent again, and counted again
    down += len(model.content)
    assert traffic(agent, job["id"]) == (0, down)

    # received whatever becomes of it: a rejected body, the accepted one, a retry of it
    assert agent.upload(task["id"], b"\x00" * 64).status_code == 422
    payload, metrics = agent.train(task)
    down += len(model.content) + len(shard.content)  # train() downloads both again
    assert agent.upload(task["id"], payload, metrics).status_code == 202
    assert agent.upload(task["id"], payload, metrics).status_code == 200
    assert traffic(agent, job["id"]) == (64 + 2 * len(payload), down)

    # another node asking for this task learns nothing and moves nothing
    assert other.model(task["id"]).status_code == 404
    assert other.upload(task["id"], payload).status_code == 404
    assert traffic(other, job["id"]) == (0, 0)
    assert NodeTraffic.objects.count() == 1


def test_counters_are_per_job(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    first, second = submit(tier="platform"), submit(tier="platform")
    sizes: dict[str, int] = {}
    for _ in range(6):  # the first task of each job (3 shards each)
        task = agent.claim()
        if task["job_id"] not in sizes:
            sizes[task["job_id"]] = len(agent.model(task["id"]).content)
    assert set(sizes) == {first["id"], second["id"]}
    for job_id, size in sizes.items():
        assert traffic(agent, job_id) == (0, size)
        assert job_traffic(job_id) == {
            agent.node_id: {
                "name": Node.objects.get(pk=agent.node_id).name,
                "bytes_up": 0,
                "bytes_down": size,
            }
        }


class Counting:
    """A test agent that adds up the bodies it downloads and uploads."""

    def __init__(self, agent) -> None:
        self.agent, self.up, self.down = agent, 0, 0

    def run_one(self) -> bool:
        task = self.agent.claim()
        if task is None:
            return False
        sent = len(self.agent.model(task["id"]).content) + len(self.agent.shard(task["id"]).content)
        payload, metrics = self.agent.train(task)  # downloads both once more
        self.down += 2 * sent
        response = self.agent.upload(task["id"], payload, metrics)
        assert response.status_code == 202, response.content
        self.up += len(payload)
        return True


def test_demo_summary_reports_traffic_and_utilization(make_agent, submit) -> None:
    agents = [Counting(make_agent(kind="platform")) for _ in range(3)]
    spec = SMALL_SPEC | {"rounds": {"max_rounds": 5, "target": {"metric": "accuracy",
                                                               "value": 0.01}}}  # fmt: skip
    job = submit(spec, tier="platform")
    while any([a.run_one() for a in agents]):
        pass
    done = Job.objects.get(pk=job["id"])
    assert done.status == "completed" and done.reached_target

    s = summarize(job["id"], {})
    names = {a.agent.node_id: Node.objects.get(pk=a.agent.node_id).name for a in agents}
    assert s["bytes_up_per_node"] == {names[a.agent.node_id]: a.up for a in agents}
    assert s["bytes_down_per_node"] == {names[a.agent.node_id]: a.down for a in agents}
    rows = {n["name"]: n for n in s["nodes"]}
    for a in agents:
        row = rows[names[a.agent.node_id]]
        assert (row["bytes_up"], row["bytes_down"]) == (a.up, a.down)

    # utilization as the simulator defines it: compute s / (nodes x wall s)
    first = Round.objects.get(job_id=job["id"], number=1)
    wall = (done.finished_at - first.opened_at).total_seconds()
    compute = sum(TaskResult.objects.filter(task__round__job_id=job["id"])
                  .values_list("compute_s", flat=True))  # fmt: skip
    assert s["job_wall_s"] == pytest.approx(wall, abs=0.01)
    assert s["time_to_target_s"] == s["job_wall_s"]
    assert s["utilization"] == pytest.approx(compute / (3 * wall), abs=1e-4)
    assert 0 <= s["utilization"] <= 1

    lines: list[str] = []
    print_summary(s | {"wall_s": 1.0, "model_path": "model.safetensors"}, lines.append)
    mean_up = sum(a.up for a in agents) / 3 / 1e3
    assert any(f"traffic per node (mean of 3): {mean_up:.1f} kB up" in line for line in lines)


def test_a_job_short_of_its_target_has_no_time_to_it(make_agent, submit) -> None:
    agent = Counting(make_agent(kind="platform"))
    job = submit(SMALL_SPEC | {"rounds": {"max_rounds": 1}}, tier="platform")
    while agent.run_one():
        pass
    s = summarize(job["id"], {})
    assert s["status"] == "completed" and not s["reached_target"]
    assert s["time_to_target_s"] is None and s["job_wall_s"] > 0
    assert set(s["bytes_up_per_node"]) == set(s["bytes_down_per_node"]) and s["utilization"] >= 0


def test_downloads_go_gzip_encoded_where_accepted_and_it_pays(make_agent, submit) -> None:
    agent = make_agent(kind="platform")
    job = submit(tier="platform")
    task = agent.claim()
    url = f"/api/v1/agent/tasks/{task['id']}"
    plain = agent.shard(task["id"])
    assert "Content-Encoding" not in plain and "Accept-Encoding" in plain["Vary"]
    packed = agent.client.get(f"{url}/shard", HTTP_ACCEPT_ENCODING="br, gzip;q=0.9")
    assert packed["Content-Encoding"] == "gzip"
    assert gzip.decompress(packed.content) == plain.content
    assert len(packed.content) < len(plain.content) / 2  # digits pixels repeat
    # a model's random weights would shrink by less than an eighth: sent as they are
    model = agent.client.get(f"{url}/model", HTTP_ACCEPT_ENCODING="gzip")
    assert "Content-Encoding" not in model and model.content == agent.model(task["id"]).content
    # the counters hold the bytes on the wire
    down = len(plain.content) + len(packed.content) + 2 * len(model.content)
    assert traffic(agent, job["id"]) == (0, down)


def test_the_link_probe_moves_random_bytes_outside_any_job(make_agent, submit, buyer) -> None:
    agent = make_agent(kind="platform")
    submit(tier="platform")
    got = agent.client.get("/api/v1/agent/probe?bytes=50000", HTTP_ACCEPT_ENCODING="gzip")
    assert got.status_code == 200 and len(got.content) == 50000
    assert "Content-Encoding" not in got  # random: nothing to gain
    assert len(agent.client.get("/api/v1/agent/probe").content) == 32 * 1024
    sent = agent.client.post(
        "/api/v1/agent/probe", data=b"\x07" * 40000, content_type="application/octet-stream"
    )
    assert sent.status_code == 200 and sent.json() == {"received": 40000}
    too_many = agent.client.get("/api/v1/agent/probe?bytes=10000000")
    assert too_many.status_code == 400 and "bytes" in too_many.json()["detail"]
    too_big = agent.client.post(
        "/api/v1/agent/probe", data=b"\x00" * 300_000, content_type="application/octet-stream"
    )
    assert too_big.status_code == 413 and "262144" in too_big.json()["detail"]
    assert not NodeTraffic.objects.exists()  # the link test is no job's traffic
    assert buyer.get("/api/v1/agent/probe").status_code == 403  # node keys only
