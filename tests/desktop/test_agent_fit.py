"""The agent checks a claimed task's memory estimate before it takes the task on."""

from __future__ import annotations

from fake_marketplace import digits_task
from test_agent_loop import make_agent, wait_for

from trainer.fit import Footprint


def test_a_task_too_big_for_free_memory_goes_back_undownloaded(
    market, logged_in, isolated_dirs, fake_bench
) -> None:
    big = digits_task("t-big")
    # a billion trainable parameters under Adam: some 16 GB before activations
    huge = Footprint(parameters=10**9, trainable=10**9, state_bytes=4 * 10**9,
                     activation_bytes=10**6)  # fmt: skip
    big.task["footprint"] = huge.to_dict()
    big.task["spec"]["optimizer"]["name"] = "adamw"
    logged_in.task_memory_mb = 4096  # a CPU node: the sandbox's RAM bounds what a task gets
    agent = make_agent(logged_in, isolated_dirs, fake_bench)
    market.add(big)
    agent.start()
    try:
        wait_for(lambda: big.failed, what="the task handed back")
        small = digits_task("t-small")
        fitting = Footprint(parameters=10**4, trainable=10**4, state_bytes=4 * 10**4,
                            activation_bytes=10**3)  # fmt: skip
        small.task["footprint"] = fitting.to_dict()
        market.add(small)
        wait_for(lambda: "t-small" in market.accepted(), what="the task that fits")
    finally:
        agent.stop()
    assert big.failed[0]["reason"] == "oom" and "does not fit" in big.failed[0]["detail"]
    assert not any("t-big/model" in path or "t-big/shard" in path
                   for _, path, _ in market.requests)  # fmt: skip
    assert agent.status().completed == 1
