"""Local datasets (federated silos): `gpuflex-node datasets add/list/remove`, the local API's
/datasets, what is advertised (schema, rows, hash; never a row), and the read-only bind a
federated task reads its dataset through."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from desktop import local_datasets as ld
from desktop.cli import main
from desktop.config import InvalidSettings, Settings, apply_changes, load_settings
from desktop.control import ControlClient, ControlError
from desktop.sandbox import LOCAL_DATA_ROOT, Limits, Sandbox, bwrap_usable
from tests.desktop.test_local_api import open_daemon

needs_bwrap = pytest.mark.skipif(not bwrap_usable(), reason="bubblewrap missing or unusable")

ROWS = [[1.25, 3.5, 0], [2.75, 9.125, 1], [4.0625, 7.375, 0], [8.5, 1.0625, 1], [6.25, 2.5, 1]]


def write_csv(path: Path, rows: list[list[float]] = ROWS) -> Path:
    path.write_text("a,b,label\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def test_add_list_remove(isolated_dirs, tmp_path, capsys) -> None:
    table = write_csv(tmp_path / "clinic.csv")
    assert main(["datasets", "add", "clinic", str(table)]) == 0
    assert "declared 'clinic': csv, 5 rows of 2, 2 classes" in capsys.readouterr().out
    assert main(["datasets", "list", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["path"] == str(table.resolve()) and listed["columns"] == ["a", "b", "label"]
    assert (listed["rows"], listed["input_shape"], listed["num_classes"]) == (5, [2], 2)
    assert listed["content_hash"] == ld.content_hash(table)
    assert main(["datasets", "remove", "clinic"]) == 0
    assert load_settings(isolated_dirs).local_datasets == []
    assert table.exists()  # forgotten, not deleted


def test_clear_errors(isolated_dirs, tmp_path, capsys) -> None:
    table = write_csv(tmp_path / "clinic.csv")
    assert main(["datasets", "add", "clinic", str(table)]) == 0
    capsys.readouterr()
    # the same name twice
    assert main(["datasets", "add", "clinic", str(table)]) == 2
    assert "already declared" in capsys.readouterr().err
    # a path that is not there
    assert main(["datasets", "add", "other", str(tmp_path / "missing.csv")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    # a file the trainer's reader cannot read as a dataset
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK\x03\x04 not really a zip archive")
    assert main(["datasets", "add", "broken", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "cannot be used as a npz dataset" in err and "broken.npz" in err
    ragged = write_csv(tmp_path / "ragged.csv", [[1, 2, 0], [1, 2]])  # type: ignore[list-item]
    assert main(["datasets", "add", "ragged", str(ragged)]) == 2
    assert "row 2 has 2 fields" in capsys.readouterr().err
    # a format that cannot be told from the name
    odd = tmp_path / "data.bin"
    odd.write_bytes(b"\0" * 8)
    assert main(["datasets", "add", "odd", str(odd)]) == 2
    assert "--kind" in capsys.readouterr().err
    # a name the marketplace would refuse
    assert main(["datasets", "add", "../x", str(table)]) == 2
    assert "not a usable dataset name" in capsys.readouterr().err
    assert main(["datasets", "remove", "nothing"]) == 2
    assert "no local dataset named 'nothing'" in capsys.readouterr().err
    assert [d["name"] for d in load_settings(isolated_dirs).local_datasets] == ["clinic"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused(isolated_dirs, tmp_path, capsys) -> None:
    table = write_csv(tmp_path / "secret.csv")
    table.chmod(0)
    assert main(["datasets", "add", "secret", str(table)]) == 2
    assert "not readable" in capsys.readouterr().err


def test_the_advertisement_carries_schema_rows_and_hash_never_a_row(tmp_path) -> None:
    table = write_csv(tmp_path / "clinic.csv")
    found = ld.inspect("clinic", table)
    sent = found.advertised()
    assert sent == {
        "name": "clinic", "rows": 5, "content_hash": ld.content_hash(table), "kind": "csv",
        "input_shape": [2], "num_classes": 2, "columns": ["a", "b", "label"],
    }  # fmt: skip
    text = json.dumps(sent)
    assert str(table) not in text  # nor where it is
    assert not any(str(v) in text for row in ROWS for v in row[:2])
    # an image folder advertises its class names; an npz its shape
    images = tmp_path / "images"
    from PIL import Image

    for cls in ("cat", "dog"):
        (images / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (8, 8), color=40 * i + (cls == "dog") * 100).save(
                images / cls / f"{i}.png"
            )
    pics = ld.inspect("pics", images, image_size=8).advertised()
    assert (pics["kind"], pics["rows"], pics["input_shape"], pics["classes"]) == (
        "image_folder", 6, [1, 8, 8], ["cat", "dog"],
    )  # fmt: skip
    np.savez(tmp_path / "a.npz", x=np.ones((4, 3, 2), np.float32), y=np.array([0, 1, 0, 1]))
    assert ld.inspect("arr", tmp_path / "a.npz").advertised()["input_shape"] == [3, 2]


def test_a_change_on_disk_is_noticed_and_the_hash_follows_the_content(tmp_path) -> None:
    table = write_csv(tmp_path / "clinic.csv")
    found = ld.inspect("clinic", table)
    assert not found.changed()
    write_csv(table, [*ROWS, [3.0, 3.0, 0]])
    assert found.changed()
    assert ld.inspect("clinic", table).content_hash != found.content_hash


def test_settings_changes_cannot_bypass_the_checks() -> None:
    with pytest.raises(InvalidSettings, match="datasets add/remove"):
        apply_changes(Settings(), {"local_datasets": [{"name": "x", "path": "/etc/shadow"}]})


@pytest.fixture
def running_agent(market, logged_in, isolated_dirs, fake_bench):
    d = open_daemon(isolated_dirs, logged_in, fake_bench).start()
    yield d
    d.close()


def test_the_local_api_declares_and_forgets(running_agent, isolated_dirs, tmp_path) -> None:
    client = ControlClient(isolated_dirs)
    table = write_csv(tmp_path / "clinic.csv")
    added = client.add_dataset("clinic", str(table))
    assert added["rows"] == 5 and [d["name"] for d in client.datasets()] == ["clinic"]
    with pytest.raises(ControlError, match="already declared"):
        client.add_dataset("clinic", str(table))
    with pytest.raises(ControlError, match="no such file"):
        client.add_dataset("x", str(tmp_path / "nope.csv"))
    assert main(["datasets", "list"]) == 0  # the CLI goes through the running agent
    client.remove_dataset("clinic")
    assert client.datasets() == [] and load_settings(isolated_dirs).local_datasets == []


@needs_bwrap
def test_a_task_reads_its_dataset_read_only_and_sees_nothing_else(tmp_path) -> None:
    (tmp_path / "data").mkdir()
    table = write_csv(tmp_path / "data" / "clinic.csv")
    sandbox = Sandbox(Limits(memory_mb=2048, wall_s=60), use_bwrap=True, warm=False)
    inside = sandbox.data_path("clinic", table)
    assert inside == f"{LOCAL_DATA_ROOT}/clinic.csv"
    code = (
        "import json, os, pathlib\n"
        f"p = pathlib.Path({inside!r})\n"
        "report = {'text': p.read_text()}\n"
        "try:\n"
        "    p.write_text('tampered')\n"
        "    report['write'] = 'ok'\n"
        "except OSError as exc:\n"
        "    report['write'] = type(exc).__name__\n"
        f"report['host_path'] = os.path.exists({str(table)!r})\n"
        f"report['listing'] = sorted(os.listdir({LOCAL_DATA_ROOT!r}))\n"
        "pathlib.Path('report.json').write_text(json.dumps(report))\n"
    )
    folder = tmp_path / "task"
    result = sandbox.run(folder, [sys.executable, "-c", code], read_only={str(table): inside})
    assert result.ok, result.stderr_tail
    report = json.loads((folder / "report.json").read_text())
    assert report["text"] == table.read_text() and report["write"] != "ok"
    assert report == report | {"host_path": False, "listing": ["clinic.csv"]}
    assert table.read_text().startswith("a,b,label")
