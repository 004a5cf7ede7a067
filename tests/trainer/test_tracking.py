"""Each tracker writes a real store, read back with that tracker's own reader: MLflow's client
over a local file store, TensorBoard's event accumulator, and W&B's protobuf records from the
offline run's .wandb file."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest

from trainer.spec import parse_spec
from trainer.tracking import (
    JOB_TAG,
    JobRecord,
    MLflowTracker,
    RoundRecord,
    TensorBoardTracker,
    WandbTracker,
    log_job,
    spec_params,
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def record(tmp_path: Path) -> JobRecord:
    model = tmp_path / "job-1.safetensors"
    model.write_bytes(b"weights")
    spec = parse_spec({"name": "digits", "optimizer": {"lr": 0.05}, "model": {"hidden": [32]}})
    rounds = [
        RoundRecord(1, {"accuracy": 0.5, "loss": 1.5, "upload_bytes": 1000.0, "nodes": 3.0,
                        "cost": 0.01}),
        RoundRecord(2, {"accuracy": 0.75, "loss": 0.9, "upload_bytes": 1000.0, "nodes": 2.0,
                        "cost": 0.02}),
    ]  # fmt: skip
    return JobRecord("job-1", "digits", spec_params(spec.to_dict()), rounds, model)


def test_spec_params_flatten_the_spec() -> None:
    params = spec_params(parse_spec({"name": "x", "model": {"hidden": [8, 4]}}).to_dict())
    assert params["model.hidden"] == "[8, 4]"
    assert params["optimizer.lr"] == "0.1"
    assert params["name"] == "x"


def test_mlflow_file_store_reads_back_with_mlflow(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    rec = record(tmp_path)
    tracker = MLflowTracker(uri, "gpuflex", rec.job_id, rec.name)
    # rounds arrive one at a time, each through a tracker of its own (as worker tasks do)
    tracker.log_params(rec.params)
    tracker.log_metrics(1, rec.rounds[0].metrics)
    tracker.close()
    log_job(
        MLflowTracker(uri, "gpuflex", rec.job_id, rec.name), replace(rec, rounds=rec.rounds[1:])
    )

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("gpuflex")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.tags[JOB_TAG] == "job-1"
    assert run.data.params["optimizer.lr"] == "0.05"
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "accuracy")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert client.get_metric_history(run.info.run_id, "cost")[-1].value == 0.02
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["job-1.safetensors"]


def test_tensorboard_events_read_back_with_event_accumulator(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rec = record(tmp_path)
    log_job(TensorBoardTracker(tmp_path / "tb"), rec)

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert {"accuracy", "loss", "upload_bytes", "nodes", "cost"} <= set(acc.Tags()["scalars"])
    assert [(e.step, e.value) for e in acc.Scalars("accuracy")] == [(1, 0.5), (2, 0.75)]
    assert [e.value for e in acc.Scalars("nodes")] == [3.0, 2.0]
    params = acc.Tensors("params/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| optimizer.lr | 0.05 |" in params
    assert (tmp_path / "tb" / "artifacts" / "job-1.safetensors").read_bytes() == b"weights"


def wandb_records(path: Path) -> list:
    """The protobuf records of an offline run's .wandb file. wandb 0.31 has no Python reader of
    its own any more (its Go core reads them), so the framing, LevelDB's log format (32 KiB
    blocks, records of crc32, length, type), is read here and each record is parsed with
    wandb's own protobuf schema."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pos, block, pending = [], 7, 32 * 1024, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in the block for a header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
    return out


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_reads_back_with_wandb_protobufs(tmp_path: Path) -> None:
    rec = record(tmp_path)
    log_job(WandbTracker(tmp_path / "wb", "gpuflex", rec.job_id, rec.name), rec)

    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-job-1.wandb")
    records = wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in records]
    history = [
        {_key(item): item.value_json for item in r.history.item} | {"step": r.history.step.num}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [(h["step"], h["accuracy"]) for h in history] == [(1, "0.5"), (2, "0.75")]
    assert history[1]["cost"] == "0.02"
    config = {
        _key(item): item.value_json
        for r in records
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
    }
    assert config["optimizer.lr"] == '"0.05"'
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert [a.type for a in artifacts] == ["model"]
    assert "exit" in kinds


@pytest.mark.parametrize(
    ("tracking", "reason"),
    [
        ({"backends": ["mlflow"], "mlflow_uri": "file:/etc"}, "http(s) URL"),
        ({"backends": ["mlflow"], "mlflow_uri": "sqlite:///x.db"}, "http(s) URL"),
        ({"backends": ["mlflow"], "mlflow_uri": "https://u:p@host"}, "no credentials"),
        ({"backends": ["tensorboard"], "mlflow_uri": "https://mlflow.example"}, "not among"),
        ({"backends": ["wandb", "wandb"]}, "each tracker once"),
        ({"backends": ["comet"]}, "Input should be"),
        ({"experiment": "../../etc"}, "pattern"),
    ],
)
def test_spec_tracking_refuses_what_would_write_anywhere(tracking: dict, reason: str) -> None:
    from trainer.spec import SpecError

    with pytest.raises(SpecError, match="tracking") as exc:
        parse_spec({"name": "x", "tracking": tracking})
    assert reason in str(exc.value)


def test_spec_tracking_takes_a_remote_mlflow() -> None:
    spec = parse_spec(
        {
            "name": "x",
            "tracking": {
                "backends": ["mlflow", "tensorboard"],
                "mlflow_uri": "https://mlflow.example:5000",
            },
        }
    )
    assert spec.tracking.backends == ["mlflow", "tensorboard"]


@pytest.mark.parametrize(
    ("resolved", "refused"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("169.254.169.254", True),  # a cloud's metadata service
        ("::1", True),
        ("fd00::1", True),
        ("93.184.216.34", False),
    ],
)
def test_a_tracking_url_must_reach_a_public_address(resolved: str, refused: bool) -> None:
    """The server calls the buyer's MLflow URL: it must not be made to call its own network."""
    from trainer.tracking import PrivateAddress, check_public_url

    def resolve(host: str, port: object) -> list:
        assert host == "mlflow.example"
        return [(None, None, None, "", (resolved, 0))]

    if refused:
        with pytest.raises(PrivateAddress, match=rf"'mlflow.example' is {resolved}"):
            check_public_url("https://mlflow.example:5000/", resolve=resolve)
    else:
        check_public_url("https://mlflow.example:5000/", resolve=resolve)


def test_a_tracking_url_that_does_not_resolve_is_refused() -> None:
    from trainer.tracking import PrivateAddress, check_public_url

    with pytest.raises(PrivateAddress, match="does not resolve"):
        check_public_url("https://no-such-host.invalid/")
