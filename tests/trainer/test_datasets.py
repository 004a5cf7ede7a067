from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from trainer.datasets import (
    IGNORE_INDEX,
    Dataset,
    DatasetError,
    load_csv_dataset,
    load_dataset,
    load_digits_dataset,
    load_image_folder,
    load_npz_dataset,
    load_parquet_dataset,
    load_text_dataset,
)
from trainer.spec import DatasetSpec

# -- helpers ---------------------------------------------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _csv(tmp_path: Path, rows: list[str], header: str = "a,b,label") -> Path:
    return _write(tmp_path / "data.csv", "\n".join([header, *rows]) + "\n")


def _labelled_rows(n: int = 20) -> list[str]:
    # Feature a encodes the class (0 = ant, 1 = cat, 2 = dog) so tests can check the mapping.
    names = ["cat", "dog", "ant"]
    code = {"ant": 0, "cat": 1, "dog": 2}
    return [f"{code[names[i % 3]]},{i},{names[i % 3]}" for i in range(n)]


def _all_rows(ds: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([ds.x_train, ds.x_test]), torch.cat([ds.y_train, ds.y_test])


def _png(path: Path, value: int | tuple[int, int, int], mode: str = "L", size: int = 6) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (size, size), value).save(path)
    return path


# -- digits ----------------------------------------------------------------------------------


def test_digits_shapes_range_and_stratified_split() -> None:
    ds = load_digits_dataset()
    assert ds.task == "classification"
    assert ds.num_classes == 10 and ds.input_shape == (64,)
    assert ds.num_test == 360 and ds.num_train == 1797 - 360
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    x, y = _all_rows(ds)
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    totals = torch.bincount(y, minlength=10).double()
    test_counts = torch.bincount(ds.y_test, minlength=10).double()
    assert torch.all((test_counts - 0.2 * totals).abs() <= 1.0)


def test_digits_split_is_deterministic_per_seed() -> None:
    a, b, c = load_digits_dataset(seed=3), load_digits_dataset(seed=3), load_digits_dataset(seed=4)
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_train, b.y_train)
    assert not torch.equal(a.x_test, c.x_test)
    assert load_digits_dataset(test_fraction=0.5).num_test == 899


# -- CSV -------------------------------------------------------------------------------------


def test_csv_string_labels_sorted_and_split(tmp_path: Path) -> None:
    ds = load_csv_dataset(_csv(tmp_path, _labelled_rows(30)), test_fraction=0.2, seed=1)
    assert ds.num_classes == 3 and ds.input_shape == (2,)
    assert ds.num_train == 24 and ds.num_test == 6
    x, y = _all_rows(ds)
    assert torch.equal(x[:, 0].long(), y)  # ant=0, cat=1, dog=2
    assert sorted(x[:, 1].tolist()) == list(range(30))  # every row exactly once
    assert torch.bincount(ds.y_test).tolist() == [2, 2, 2]  # stratified


def test_csv_numeric_labels_sort_numerically(tmp_path: Path) -> None:
    rows = [f"{lab},{i},{lab}" for i, lab in enumerate(["10", "9", "2"] * 4)]
    ds = load_csv_dataset(_csv(tmp_path, rows))
    x, y = _all_rows(ds)
    expected = {2.0: 0, 9.0: 1, 10.0: 2}
    assert [expected[v] for v in x[:, 0].tolist()] == y.tolist()
    # "1" and "1.0" are the same class; fractional labels stay distinct floats
    rows = [f"{i},{lab}" for i, lab in enumerate(["1", "1.0", "2", "2.5"] * 3)]
    ds = load_csv_dataset(_csv(tmp_path, rows, header="a,label"))
    assert ds.num_classes == 3


def test_csv_custom_label_column_and_tiny_file(tmp_path: Path) -> None:
    # 3 rows, 2 classes, one with a single sample: stratification is impossible, falls back.
    path = _csv(tmp_path, ["1,x,2", "3,y,4", "5,y,6"], header="f1,target,f2")
    ds = load_csv_dataset(path, label_column="target", test_fraction=0.34)
    assert ds.input_shape == (2,) and ds.num_classes == 2
    assert ds.num_train + ds.num_test == 3 and ds.num_test >= 1


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("", r"empty file"),
        ("a,b,label\n", r"empty file .*no data rows"),
        ("a,b,y\n1,2,0\n3,4,1\n", r"no label column 'label'.*'a', 'b', 'y'"),
        ("a,b,label\n1,2,0\n3,oops,1\n", r"column 'b', row 2: 'oops' is not a number"),
        ("a,b,label\n1,,0\n3,4,1\n", r"column 'b', row 1: an empty value is not a number"),
        ("a,b,label\n1,2,0\nnan,4,1\n", r"column 'a', row 2 holds a non-finite value \(nan\)"),
        ("a,b,label\n1,2,0\n3,inf,1\n", r"column 'b', row 2 holds a non-finite value \(inf\)"),
        ("a,b,label\n1,2,0\n3,4\n", r"row 2 has 2 fields but the header has 3"),
        ("a,b,label\n1,2,0\n3,4,0\n", r"only one class \(label 0\)"),
        ("label\n0\n1\n", r"no feature columns"),
        ("a,a,label\n1,2,0\n3,4,1\n", r"duplicate column names \['a'\]"),
        ("a,b,label\n1,2,0\n3,4,\n", r"row 2 has no label"),
    ],
)
def test_csv_errors_name_file_and_problem(tmp_path: Path, content: str, match: str) -> None:
    path = _write(tmp_path / "bad.csv", content)
    with pytest.raises(DatasetError, match=match) as info:
        load_csv_dataset(path)
    assert "bad.csv" in str(info.value)


def test_csv_missing_and_undecodable_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"nope\.csv: does not exist"):
        load_csv_dataset(tmp_path / "nope.csv")
    with pytest.raises(DatasetError, match=r"is not a file"):
        load_csv_dataset(tmp_path)
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"a,label\n\xff,0\n")
    with pytest.raises(DatasetError, match=r"latin1\.csv: cannot read CSV"):
        load_csv_dataset(bad)


# -- Parquet ---------------------------------------------------------------------------------


def _parquet(tmp_path: Path, columns: dict[str, list[object]]) -> Path:
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table(columns), path)
    return path


def test_parquet_happy_path(tmp_path: Path) -> None:
    n = 20
    path = _parquet(
        tmp_path,
        {
            "f1": [float(i % 2) for i in range(n)],
            "f2": list(range(n)),
            "label": ["b" if i % 2 else "a" for i in range(n)],
        },
    )
    ds = load_parquet_dataset(path, seed=2)
    assert ds.input_shape == (2,) and ds.num_classes == 2 and ds.num_test == 4
    x, y = _all_rows(ds)
    assert torch.equal(x[:, 0].long(), y)
    assert sorted(x[:, 1].tolist()) == list(range(n))


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ({"f": [], "label": []}, r"empty file \(no rows\)"),
        ({"f": [1.0, 2.0], "y": [0, 1]}, r"no label column 'label'.*'f', 'y'"),
        ({"f": ["1", "x"], "label": [0, 1]}, r"column 'f', row 2: 'x' is not a number"),
        ({"f": [1.0, None], "label": [0, 1]}, r"column 'f', row 2: missing value"),
        ({"f": [float("nan"), 1.0], "label": [0, 1]}, r"column 'f', row 1 .*non-finite"),
        ({"f": [1.0, 2.0], "label": ["a", "a"]}, r"only one class \(label 'a'\)"),
    ],
)
def test_parquet_errors(tmp_path: Path, columns: dict[str, list[object]], match: str) -> None:
    with pytest.raises(DatasetError, match=match) as info:
        load_parquet_dataset(_parquet(tmp_path, columns))
    assert "data.parquet" in str(info.value)


def test_parquet_corrupt_and_missing(tmp_path: Path) -> None:
    bad = tmp_path / "junk.parquet"
    bad.write_bytes(b"this is not parquet at all")
    with pytest.raises(DatasetError, match=r"junk\.parquet: cannot read Parquet"):
        load_parquet_dataset(bad)
    with pytest.raises(DatasetError, match=r"gone\.parquet: does not exist"):
        load_parquet_dataset(tmp_path / "gone.parquet")


# -- NPZ -------------------------------------------------------------------------------------


def _npz(tmp_path: Path, **arrays: np.ndarray) -> Path:
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return path


def test_npz_2d_and_string_labels(tmp_path: Path) -> None:
    x = np.arange(40, dtype=np.float64).reshape(20, 2)
    y = np.array(["yes" if i % 2 else "no" for i in range(20)])
    ds = load_npz_dataset(_npz(tmp_path, x=x, y=y))
    assert ds.input_shape == (2,) and ds.num_classes == 2
    xs, ys = _all_rows(ds)
    assert torch.equal(((xs[:, 0] / 2) % 2).long(), ys)  # "no" = 0, "yes" = 1


def test_npz_nd_features_and_alternative_keys(tmp_path: Path) -> None:
    x = np.random.default_rng(0).random((12, 1, 8, 8)).astype(np.float32)
    target = np.arange(12) % 3
    ds = load_npz_dataset(_npz(tmp_path, features=x, target=target), label_column="target")
    assert ds.input_shape == (1, 8, 8) and ds.x_train.shape[1:] == (1, 8, 8)
    assert ds.num_classes == 3 and ds.num_train + ds.num_test == 12


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"y": np.array([0, 1])}, r"no features array 'x' or 'features'; arrays present: 'y'"),
        ({"x": np.ones((2, 2))}, r"no labels array 'y' or 'label'; arrays present: 'x'"),
        ({"x": np.ones(4), "y": np.arange(4) % 2}, r"features must be \[N, \.\.\.\]"),
        ({"x": np.ones((0, 3)), "y": np.array([])}, r"empty file \(no rows\)"),
        ({"x": np.ones((3, 2)), "y": np.array([0, 1])}, r"3 feature rows but 2 labels"),
        ({"x": np.ones((2, 2)), "y": np.ones((2, 2))}, r"labels must be 1-D"),
        ({"x": np.array([["a", "b"], ["c", "d"]]), "y": np.array([0, 1])}, r"not numeric"),
        (
            {"x": np.array([[1.0, np.nan], [1.0, 2.0]]), "y": np.array([0, 1])},
            r"sample 0, position \(1,\) holds a non-finite value \(nan\)",
        ),
        ({"x": np.array([[np.inf], [1.0]]), "y": np.array([0, 1])}, r"non-finite value \(inf\)"),
        ({"x": np.ones((3, 2)), "y": np.array([5, 5, 5])}, r"only one class \(label 5\)"),
    ],
)
def test_npz_errors(tmp_path: Path, arrays: dict[str, np.ndarray], match: str) -> None:
    with pytest.raises(DatasetError, match=match) as info:
        load_npz_dataset(_npz(tmp_path, **arrays))
    assert "data.npz" in str(info.value)


def test_npz_ragged_rows_refused_without_unpickling(tmp_path: Path) -> None:
    ragged = np.empty(2, dtype=object)
    ragged[0], ragged[1] = [1.0, 2.0], [3.0]
    path = tmp_path / "ragged.npz"
    np.savez(path, x=ragged, y=np.array([0, 1]))  # numpy pickles object arrays
    with pytest.raises(DatasetError, match=r"ragged\.npz: array 'x' is an object array"):
        load_npz_dataset(path)


def test_npz_unreadable_and_missing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DatasetError, match=r"bad\.npz: cannot read NPZ"):
        load_npz_dataset(bad)
    single = tmp_path / "single.npz"
    with single.open("wb") as f:
        np.save(f, np.ones((3, 2)))
    with pytest.raises(DatasetError, match=r"single\.npz: is a single \.npy array"):
        load_npz_dataset(single)
    with pytest.raises(DatasetError, match=r"missing\.npz: does not exist"):
        load_npz_dataset(tmp_path / "missing.npz")


# -- image folders ---------------------------------------------------------------------------


def test_image_folder_grey(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    for i in range(5):
        _png(root / "zebra" / f"{i}.png", 255)
        _png(root / "apple" / f"{i}.bmp", 0)
    (root / "apple" / "notes.txt").write_text("not an image")
    ds = load_image_folder(root, image_size=4, test_fraction=0.2)
    assert ds.input_shape == (1, 4, 4) and ds.x_train.shape[1:] == (1, 4, 4)
    assert ds.num_classes == 2 and ds.num_train + ds.num_test == 10
    x, y = _all_rows(ds)
    # apple (sorted first) = 0 = black images, zebra = 1 = white images
    assert torch.equal(x.amax(dim=(1, 2, 3)), y.float())
    assert torch.equal(x.amin(dim=(1, 2, 3)), y.float())


def test_image_folder_any_colour_image_makes_rgb(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    _png(root / "a" / "0.png", 128)
    _png(root / "a" / "1.jpg", 200)
    _png(root / "b" / "0.png", (255, 0, 0), mode="RGB")
    _png(root / "b" / "1.gif", 30)
    ds = load_image_folder(root, image_size=5, test_fraction=0.25)
    assert ds.input_shape == (3, 5, 5)
    x, _ = _all_rows(ds)
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    red = [img for img in x if img[0].mean() > 0.99 and img[1].mean() < 0.01]
    assert len(red) == 1  # the colour image kept its colour
    grey = [img for img in x if torch.equal(img[0], img[1]) and torch.equal(img[1], img[2])]
    assert len(grey) == 3  # grey images became three equal channels


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        ({}, r"no class subfolders"),
        ({"only": ["0.png"]}, r"only one class folder \('only'\)"),
        ({"a": ["0.png"], "b": ["readme.txt"]}, r"b: class folder has no images"),
    ],
)
def test_image_folder_layout_errors(
    tmp_path: Path, layout: dict[str, list[str]], match: str
) -> None:
    root = tmp_path / "imgs"
    root.mkdir()
    (root / "stray.png").write_bytes(b"")  # files directly in root are not classes
    for cls, files in layout.items():
        for name in files:
            if name.endswith(".png"):
                _png(root / cls / name, 0)
            else:
                (root / cls).mkdir(exist_ok=True)
                (root / cls / name).write_text("x")
    with pytest.raises(DatasetError, match=match):
        load_image_folder(root)


def test_image_folder_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"nowhere: image folder does not exist"):
        load_image_folder(tmp_path / "nowhere")
    root = tmp_path / "imgs"
    _png(root / "a" / "0.png", 0)
    good = _png(root / "b" / "0.png", 0, size=64)
    broken = root / "b" / "1.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DatasetError, match=r"b/1\.png: unreadable or corrupt image"):
        load_image_folder(root)
    broken.unlink()
    truncated = root / "b" / "2.png"
    truncated.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(DatasetError, match=r"b/2\.png: unreadable or corrupt image"):
        load_image_folder(root)


# -- text ------------------------------------------------------------------------------------


def test_text_samples_shift_pad_and_lengths(tmp_path: Path) -> None:
    path = _write(tmp_path / "corpus.txt", "hello\r\n\nab\nq\nabcdefghijk\n")
    ds = load_text_dataset(path, seq_len=4, test_fraction=0.2, seed=0)
    assert ds.task == "language_model" and ds.num_classes == 256 and ds.input_shape == (4,)
    x, y = _all_rows(ds)
    lengths = torch.cat([ds.lengths_train, ds.lengths_test])
    # hello -> 1 chunk "hello"; ab -> "ab"; q -> nothing (no target);
    # abcdefghijk -> "abcde", "efghi", "ijk" (stride 4: every transition once)
    samples = {
        bytes(row[:k].tolist()): (row, tgt, k) for row, tgt, k in zip(x, y, lengths, strict=True)
    }
    assert set(samples) == {b"hell", b"a", b"abcd", b"efgh", b"ij"}
    row, tgt, k = samples[b"ij"]
    assert k == 2 and row.tolist() == [ord("i"), ord("j"), 0, 0]
    assert tgt.tolist() == [ord("j"), ord("k"), IGNORE_INDEX, IGNORE_INDEX]
    row, tgt, k = samples[b"hell"]
    assert tgt.tolist() == list(b"ello")
    assert ds.num_test == 1 and ds.x_train.dtype == torch.int64


def test_text_split_is_deterministic(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.txt", "\n".join(f"line number {i}" for i in range(40)))
    a, b = load_text_dataset(path, 8, seed=5), load_text_dataset(path, 8, seed=5)
    c = load_text_dataset(path, 8, seed=6)
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.lengths_train, b.lengths_train)
    assert not torch.equal(a.x_test, c.x_test)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", r"empty file"),
        (b"abc\x00def\n", r"NUL byte at offset 3"),
        (b"ok line\n\xc3\x28 bad\n", r"not valid UTF-8 at byte offset 8"),
        (b"a\nb\nc\n", r"yields 0 sample\(s\)"),
        (b"just one line\n", r"yields 1 sample\(s\)"),
    ],
)
def test_text_errors(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=match) as info:
        load_text_dataset(path, seq_len=32)
    assert "corpus.txt" in str(info.value)


def test_text_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"absent\.txt: does not exist"):
        load_text_dataset(tmp_path / "absent.txt")


# -- load_dataset ----------------------------------------------------------------------------


def test_load_dataset_dispatches_and_resolves_relative_paths(tmp_path: Path) -> None:
    _csv(tmp_path, _labelled_rows(10))
    np.savez(tmp_path / "d.npz", x=np.ones((6, 3)), y=np.arange(6) % 2)
    pq.write_table(pa.table({"f": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1]}), tmp_path / "p.pq")
    _write(tmp_path / "t.txt", "first line\nsecond line\n")
    for cls in ("a", "b"):
        _png(tmp_path / "imgs" / cls / "0.png", 9)
        _png(tmp_path / "imgs" / cls / "1.png", 9)
    cases = {
        "csv": ("data.csv", (2,)),
        "npz": ("d.npz", (3,)),
        "parquet": ("p.pq", (1,)),
        "text": ("t.txt", (16,)),
        "image_folder": ("imgs", (1, 8, 8)),
    }
    for kind, (rel, shape) in cases.items():
        spec = DatasetSpec(kind=kind, path=rel, seq_len=16, image_size=8, test_fraction=0.5)
        assert load_dataset(spec, seed=1, base_dir=tmp_path).input_shape == shape, kind
    assert load_dataset(DatasetSpec(), seed=0).num_test == 360
    with pytest.raises(DatasetError, match=r"data\.csv: does not exist"):
        load_dataset(DatasetSpec(kind="csv", path="data.csv"), base_dir=tmp_path / "elsewhere")


def test_npz_bomb_is_refused_before_it_is_inflated(tmp_path: Path, monkeypatch) -> None:
    """A member that expands past the ratio, or an archive past the total, is refused from
    its declared sizes: np.load never runs (the limits are scaled down to keep this small)."""
    from trainer.datasets import tabular

    def no_load(*_a, **_k):
        raise AssertionError("np.load ran on a refused archive")

    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, x=np.zeros((50_000, 8)), y=np.zeros(50_000))  # 3.2 MB of zeros
    monkeypatch.setattr(tabular.np, "load", no_load)
    monkeypatch.setattr(tabular, "RATIO_FREE_BYTES", 2**20)
    with pytest.raises(DatasetError, match=r"bomb\.npz: member 'x\.npy' expands [\d,]+x"):
        load_npz_dataset(path)
    monkeypatch.setattr(tabular, "MAX_NPZ_BYTES", 2**20)
    with pytest.raises(DatasetError, match=r"declares [\d,]+ bytes uncompressed; the limit"):
        load_npz_dataset(path)


def test_npz_array_header_larger_than_its_member_is_refused(tmp_path: Path) -> None:
    """numpy allocates what a header declares before it reads: 64 GB here, in 100 bytes."""
    import io
    import zipfile

    head = io.BytesIO()
    header = {"descr": "<f8", "fortran_order": False, "shape": (10**9, 8)}
    np.lib.format.write_array_header_1_0(head, header)
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", head.getvalue() + b"\0" * 64)
        y = io.BytesIO()
        np.save(y, np.zeros(2))
        z.writestr("y.npy", y.getvalue())
    with pytest.raises(DatasetError, match=r"liar\.npz: member 'x\.npy' declares a"):
        load_npz_dataset(path)
