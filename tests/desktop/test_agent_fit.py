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


def test_the_runner_trains_a_lora_task_and_hands_over_only_the_adapters(tmp_path) -> None:
    """The sandboxed runner (in-process here) on an hf_seq_cls LoRA task: the model built from
    the spec's inline config, the update checked against the adapters and holding only them."""
    import json

    import pytest
    import torch

    pytest.importorskip("peft")
    from fake_marketplace import FakeTask

    from desktop import task_runner
    from trainer.hashing import state_hash
    from trainer.lora import is_adapter_key
    from trainer.models import build_model
    from trainer.spec import parse_spec
    from trainer.updates import decode_state, encode_state

    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 64, "max_position_embeddings": 16}  # fmt: skip
    spec = parse_spec({"name": "lora", "model": {"arch": "hf_seq_cls", "config": config,
                       "lora": {"r": 2}}, "optimizer": {"name": "adamw", "lr": 0.01},
                       "local": {"steps": 2, "batch_size": 8}})  # fmt: skip
    state = {k: v.detach().clone()
             for k, v in build_model(spec.model, (8,), 3).state_dict().items()}  # fmt: skip
    g = torch.Generator().manual_seed(0)
    shard = {"x": torch.randint(1, 64, (16, 8), generator=g).float(),
             "y": torch.randint(0, 3, (16,), generator=g)}  # fmt: skip
    task = {"id": "t-lora", "job_id": "job-1", "round": 1, "kind": "train",
            "spec": spec.to_dict(), "steps": 2, "batch_size": 8, "seed": 1, "codec": "none",
            "proximal_mu": 0.0, "deadline": "2099-01-01T00:00:00Z",
            "model_hash": state_hash(state), "shard_hash": state_hash(shard)}  # fmt: skip
    t = FakeTask(task, encode_state(state), encode_state(shard), state)
    (tmp_path / "task.json").write_text(json.dumps(t.task))
    (tmp_path / "model.safetensors").write_bytes(t.model)
    (tmp_path / "shard.safetensors").write_bytes(t.shard)
    assert task_runner.run(tmp_path) == task_runner.EXIT_OK
    update, _ = decode_state((tmp_path / "update.safetensors").read_bytes())
    assert update and all(is_adapter_key(k) for k in update)
    assert len(update) < len(state)  # the frozen base stays home
