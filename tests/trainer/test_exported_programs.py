"""Exported programs (model.arch: exported): the safe reader, the gate's refusals of hostile
programs, and training one like a zoo model."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainer.datasets import load_dataset
from trainer.evaluate import evaluate
from trainer.exported import gate
from trainer.exported.archive import ArchiveError, read_archive
from trainer.exported.export import export_program
from trainer.exported.gate import GateError, check_program
from trainer.exported.loader import load_program
from trainer.local import train_local
from trainer.models import ModelSpecError, build_model
from trainer.spec import DatasetSpec, ModelSpec, parse_spec

LIMIT = 64 * 2**20
XY = (torch.zeros(4, 64), torch.zeros(4, dtype=torch.long))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.drop = nn.Linear(64, 32), nn.BatchNorm1d(32), nn.Dropout(0.5)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.relu(self.bn(self.fc1(x)))))


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return export_program(Net(), F.cross_entropy, XY, tmp_path_factory.mktemp("p") / "net.pt2")


def _rewrite(path: Path, out: Path, change) -> Path:
    """A copy of the archive with `change(name, bytes) -> bytes | None` (None: dropped)."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = change(info.filename, src.read(info))
            if data is not None:
                dst.writestr(info, data)
    return out


def _edit_json(member: str, edit):
    def change(name: str, data: bytes) -> bytes:
        if not name.endswith(member):
            return data
        doc = json.loads(data)
        edit(doc)
        return json.dumps(doc).encode()

    return change


def test_reads_names_and_trains_without_unpickling(program: Path, monkeypatch) -> None:
    # sample inputs are a torch.save pickle in every archive: never read, never unpickled
    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", no_unpickling)
    archive = read_archive(program, LIMIT)
    summary = check_program(archive)
    assert summary.input_shape == (64,) and summary.returns_logits
    module = load_program(archive)
    assert set(module.state_dict()) == {k for k in archive.weights}
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    loss, logits = module(x, y)
    loss.backward()
    assert logits.shape == (8, 10) and module.model.fc1.weight.grad is not None


def test_eval_switches_dropout_and_batch_norm(program: Path) -> None:
    module = load_program(read_archive(program, LIMIT))
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    module.eval()
    first, second = module(x, y)[1], module(x, y)[1]
    assert torch.equal(first, second)  # no dropout, running statistics
    module.train()
    torch.manual_seed(1)
    assert not torch.equal(module(x, y)[1], first)


def _refused(path: Path, match: str, error=GateError) -> None:
    with pytest.raises(error, match=match):
        check_program(read_archive(path, LIMIT))


def test_pickled_weight_is_refused(program: Path, tmp_path: Path) -> None:
    def pickled(doc):
        next(iter(doc["config"].values()))["use_pickle"] = True

    bad = _rewrite(program, tmp_path / "p.pt2", _edit_json("model_weights_config.json", pickled))
    with pytest.raises(ArchiveError, match="stored as a pickle"):
        read_archive(bad, LIMIT)


def test_legacy_pickle_member_is_refused(program: Path, tmp_path: Path) -> None:
    def add(name: str, data: bytes) -> bytes:
        return data

    bad = _rewrite(program, tmp_path / "p.pt2", add)
    with zipfile.ZipFile(bad, "a") as zf:
        prefix = zf.namelist()[0].split("/")[0]
        zf.writestr(f"{prefix}/data/weights/model.pt", b"\x80\x04pickle")
    with pytest.raises(ArchiveError, match="is a pickle"):
        read_archive(bad, LIMIT)


def test_operator_off_the_list_is_refused(tmp_path: Path) -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.cumprod(x, dim=1))

    path = export_program(Odd(), F.cross_entropy, XY, tmp_path / "odd.pt2")
    _refused(path, r"aten::cumprod .* not on the allow-list")


def test_io_operator_is_refused(program: Path, tmp_path: Path) -> None:
    def from_file(doc):
        doc["graph_module"]["graph"]["nodes"][0]["target"] = "torch.ops.aten.from_file.default"

    bad = _rewrite(program, tmp_path / "io.pt2", _edit_json("models/model.json", from_file))
    _refused(bad, "aten::from_file")


def test_custom_op_is_refused(tmp_path: Path) -> None:
    @torch.library.custom_op("gpuflex_test::shift", mutates_args=())
    def shift(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @shift.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(shift(x))

    path = export_program(Custom(), F.cross_entropy, XY, tmp_path / "custom.pt2")
    _refused(path, r"gpuflex_test::shift.* not an ATen operator")


def test_graph_over_the_node_limit_is_refused(program: Path, monkeypatch) -> None:
    monkeypatch.setattr(gate, "MAX_NODES", 3)
    _refused(program, "nodes; the limit is 3")


def test_constants_over_the_limit_are_refused(tmp_path: Path, monkeypatch) -> None:
    class WithConstant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 10)
            self.scale = torch.full((64,), 2.0)  # neither parameter nor buffer: a constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x * self.scale)

    path = export_program(WithConstant(), F.cross_entropy, XY, tmp_path / "c.pt2")
    check_program(read_archive(path, LIMIT))  # within the limits
    monkeypatch.setattr(gate, "MAX_CONSTANT_BYTES", 64)
    _refused(path, "constants hold 256 bytes; the limit is 64")


def test_program_without_a_batch_dimension_is_refused(tmp_path: Path) -> None:
    wrapped = __import__("trainer.exported.export", fromlist=["WithLoss"]).WithLoss(
        nn.Linear(64, 10), F.cross_entropy
    )
    path = tmp_path / "static.pt2"
    torch.export.save(torch.export.export(wrapped, XY), str(path))
    _refused(path, "no dynamic batch dimension")


def test_size_expression_that_is_code_is_refused(program: Path, tmp_path: Path) -> None:
    def inject(doc):
        x = doc["graph_module"]["graph"]["tensor_values"]["x"]
        x["sizes"][0]["as_expr"]["expr_str"] = "__import__('os').system('true')"

    bad = _rewrite(program, tmp_path / "expr.pt2", _edit_json("models/model.json", inject))
    _refused(bad, "not arithmetic on sizes")


def test_truncated_archive_is_refused(program: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pt2"
    cut.write_bytes(program.read_bytes()[: program.stat().st_size // 2])
    with pytest.raises(ArchiveError, match=r"not a readable \.pt2 archive|damaged"):
        read_archive(cut, LIMIT)


def test_zip_bomb_is_refused(program: Path, tmp_path: Path) -> None:
    bomb = _rewrite(program, tmp_path / "bomb.pt2", lambda name, data: data)
    with zipfile.ZipFile(bomb, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        prefix = zf.namelist()[0].split("/")[0]
        zf.writestr(f"{prefix}/data/weights/weight_0", b"\0" * (80 * 2**20))
    assert bomb.stat().st_size < 2 * 2**20  # small on disk, 80 MiB inflated
    with pytest.raises(ArchiveError, match="decompresses past"):
        read_archive(bomb, 8 * 2**20)


def test_archive_over_the_size_limit_is_refused(program: Path) -> None:
    with pytest.raises(ArchiveError, match="the limit is 100"):
        read_archive(program, 100)


def test_not_a_zip_is_refused() -> None:
    with pytest.raises(ArchiveError, match="not a readable"):
        read_archive(io.BytesIO(b"not a zip").getvalue(), LIMIT)


def test_exported_mlp_trains_as_the_zoo_mlp(tmp_path: Path) -> None:
    """Same initial weights, same batches: the same loss after local training."""
    zoo = build_model(ModelSpec(arch="mlp", hidden=[32]), (64,), 10, seed=0)
    path = export_program(zoo, F.cross_entropy, XY, tmp_path / "mlp.pt2")
    spec = parse_spec({"name": "t", "model": {"arch": "exported", "program": str(path)},
                       "local": {"steps": 5, "batch_size": 16, "grad_accum_steps": 2}})  # fmt: skip
    data = load_dataset(DatasetSpec(), seed=0)
    program = build_model(spec.model, data.input_shape, data.num_classes)
    zoo_spec = spec.replace(model={"arch": "mlp", "hidden": [32]})
    ours = train_local(program, program.state_dict(), data, spec, seed=3)
    theirs = train_local(zoo, zoo.state_dict(), data, zoo_spec, seed=3)
    assert ours.loss == pytest.approx(theirs.loss, rel=1e-5)
    assert set(ours.delta) == {f"model.{k}" for k in theirs.delta}
    ev, zev = evaluate(program, data), evaluate(zoo, data)
    assert ev.correct == zev.correct and ev.loss == pytest.approx(zev.loss, rel=1e-5)


def test_program_of_the_wrong_input_shape_is_a_model_error(program: Path) -> None:
    spec = ModelSpec(arch="exported", program=str(program))
    with pytest.raises(ModelSpecError, match=r"inputs of shape \[B, 64\]; the dataset's are"):
        build_model(spec, (1, 8, 8), 10)


def test_spec_needs_a_program_for_exported() -> None:
    with pytest.raises(Exception, match="needs a 'program'"):
        parse_spec({"name": "t", "model": {"arch": "exported"}})
    with pytest.raises(Exception, match="'program' is for arch 'exported'"):
        parse_spec({"name": "t", "model": {"arch": "mlp", "program": "a.pt2"}})


def test_trained_weights_swap_into_the_program(program: Path) -> None:
    from trainer.exported.repack import with_weights
    from trainer.updates import encode_state

    module = load_program(read_archive(program, LIMIT))
    trained = {k: v.detach() + 1.0 for k, v in module.state_dict().items()}
    repacked = with_weights(program.read_bytes(), encode_state(trained))
    again = load_program(read_archive(repacked, LIMIT))
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    # and torch itself loads it: the buyer's own machine gets a working program
    loaded = torch.export.load(io.BytesIO(repacked)).module()
    assert torch.equal(loaded.state_dict()["model.fc1.weight"], trained["model.fc1.weight"])


def test_integer_buffers_are_counters_or_refused(program: Path, tmp_path: Path) -> None:
    summary = check_program(read_archive(program, LIMIT))
    assert summary.counters == {"model.bn.num_batches_tracked"}  # loads as float32
    module = load_program(read_archive(program, LIMIT))
    assert module.state_dict()["model.bn.num_batches_tracked"].dtype == torch.float32

    class Indexed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 10)
            self.register_buffer("order", torch.arange(64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.index_select(1, self.order))

    path = export_program(Indexed(), F.cross_entropy, XY, tmp_path / "idx.pt2")
    _refused(path, "buffer 'model.order' is an integer tensor")


def test_gpuflex_sim_refuses_a_hostile_program_with_an_error(
    program: Path, tmp_path: Path, capsys
) -> None:
    from trainer.sim.cli import main

    def from_file(doc):
        doc["graph_module"]["graph"]["nodes"][0]["target"] = "torch.ops.aten.from_file.default"

    _rewrite(program, tmp_path / "io.pt2", _edit_json("models/model.json", from_file))
    spec = tmp_path / "job.yaml"
    spec.write_text("name: io\nmodel: {arch: exported, program: io.pt2}\nrounds: {max_rounds: 1}\n")
    assert main(["run", str(spec), "--nodes", "2", "--json"]) == 2
    assert "model.program: operator aten::from_file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "mangle",
    [
        lambda doc: doc["graph_module"]["signature"].update(input_specs=[{"user_input": []}]),
        lambda doc: doc["graph_module"]["graph"].update(tensor_values={"x": 3}),
        lambda doc: doc["graph_module"]["signature"].update(input_specs=[{}]),
        lambda doc: doc["graph_module"]["graph"]["nodes"].append([]),
    ],
)
def test_malformed_graph_is_a_gate_error(program: Path, tmp_path: Path, mangle) -> None:
    bad = _rewrite(program, tmp_path / "m.pt2", _edit_json("models/model.json", mangle))
    with pytest.raises(GateError):
        check_program(read_archive(bad, LIMIT))
