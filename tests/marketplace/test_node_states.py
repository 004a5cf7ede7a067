"""Why a job does not move: the states and reasons of the nodes that could work on it."""

from __future__ import annotations

from marketplace.nodes.models import Node

GAME = "another program uses the GPU (game.exe)"


def test_waiting_nodes_and_their_reason_reach_the_buyer(make_agent, submit, buyer) -> None:
    waiting = [make_agent() for _ in range(3)]
    working, paused = make_agent(), make_agent()
    too_dear = make_agent(price="9.00")  # above the job's max price: not counted
    for agent in waiting:
        assert agent.heartbeat("waiting", reason=GAME).status_code == 200
    working.heartbeat("working")
    paused.heartbeat("paused", reason="paused by you")
    too_dear.heartbeat("waiting", reason="outside the schedule (22:00-07:00)")
    job = submit()

    states = buyer.get(f"/api/v1/jobs/{job['id']}/").json()["node_states"]
    assert states["nodes"] == 5
    assert states["counts"] == {"working": 1, "idle": 0, "waiting": 3, "paused": 1}
    assert states["reasons"] == [
        {"state": "waiting", "reason": GAME, "nodes": 3},
        {"state": "paused", "reason": "paused by you", "nodes": 1},
    ]
    assert states["summary"] == f"1 working; 3 nodes waiting: {GAME}; 1 node paused: paused by you"
    # lists stay one query per page, without node states
    assert "node_states" not in buyer.get("/api/v1/jobs/").json()["results"][0]


def test_a_node_back_at_work_drops_its_reason(make_agent) -> None:
    agent = make_agent()
    agent.heartbeat("waiting", reason=GAME)
    assert Node.objects.get(pk=agent.node_id).state_reason == GAME
    agent.heartbeat("working", reason="stale words")
    node = Node.objects.get(pk=agent.node_id)
    assert (node.state, node.state_reason) == ("working", "")


def test_an_overlong_reason_is_refused_by_name(make_agent) -> None:
    response = make_agent().heartbeat("waiting", reason="x" * 201)
    assert response.status_code == 400 and "reason" in response.json()["detail"]


def test_no_node_online_says_so(submit, buyer) -> None:
    job = submit()
    states = buyer.get(f"/api/v1/jobs/{job['id']}/").json()["node_states"]
    assert states["nodes"] == 0 and "no node online" in states["summary"]
