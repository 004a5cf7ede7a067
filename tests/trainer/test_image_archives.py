"""Image datasets from zip and tar archives: the same tensors as the folder unpacked, and every
hostile or malformed archive refused before anything is decoded or written."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.image_archives import (
    class_members,
    png,
    tar_with,
    unpack_to_folder,
    write_tar,
    write_zip,
)
from trainer.datasets import (
    ArchiveLimits,
    ArchiveTooLarge,
    DatasetError,
    load_dataset,
    load_image_archive,
    load_image_folder,
)
from trainer.spec import DatasetSpec


@pytest.mark.parametrize("name", ["images.zip", "images.tar", "images.tar.gz", "images.tgz"])
def test_an_archive_loads_as_its_folder_unpacked(tmp_path: Path, name: str) -> None:
    members = class_members()
    if name.endswith(".zip"):
        archive = write_zip(tmp_path / name, members)
    else:
        archive = write_tar(tmp_path / name, members, "w" if name.endswith(".tar") else "w:gz")
    got = load_image_archive(archive, image_size=8, seed=3)
    want = load_image_folder(unpack_to_folder(tmp_path / "folder", members), 8, seed=3)
    assert torch.equal(got.x_train, want.x_train) and torch.equal(got.y_train, want.y_train)
    assert torch.equal(got.x_test, want.x_test) and torch.equal(got.y_test, want.y_test)
    assert got.num_classes == 2 and got.input_shape == (3, 8, 8)


def test_the_spec_names_an_archive_as_an_image_folder(tmp_path: Path) -> None:
    write_zip(tmp_path / "images.zip", class_members())
    spec = DatasetSpec(kind="image_folder", path="images.zip", image_size=8)
    assert load_dataset(spec, base_dir=tmp_path).num_classes == 2


def test_one_top_folder_and_hidden_files_are_fine(tmp_path: Path) -> None:
    members = {f"data/{k}": v for k, v in class_members(4).items()}
    members |= {"__MACOSX/data/._x.png": b"junk", "data/dark/.DS_Store": b"junk"}
    dataset = load_image_archive(write_zip(tmp_path / "a.zip", members), 8)
    assert dataset.num_train + dataset.num_test == 8


def _refused(path: Path, match: str, limits: ArchiveLimits | None = None, error=DatasetError):
    with pytest.raises(error, match=match):
        load_image_archive(path, 8, limits=limits)


@pytest.mark.parametrize(
    ("member", "match"),
    [
        ("../evil/x.png", r"climbs out of its folder"),
        ("dark/../../x.png", r"climbs out of its folder"),
        ("/etc/x.png", "absolute path"),
        ("C:/x/y.png", "absolute path"),
        ("..\\\\evil\\\\x.png", "climbs out"),
    ],
)
@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_names_that_leave_the_folder_are_refused(
    tmp_path: Path, member: str, match: str, kind: str
) -> None:
    members = class_members(4) | {member: png(1)}
    path = (write_zip if kind == "zip" else write_tar)(tmp_path / f"a.{kind}", members)
    _refused(path, match)


def test_a_zip_symlink_is_refused(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "a.zip", class_members(4))
    with zipfile.ZipFile(path, "a") as zf:
        info = zipfile.ZipInfo("dark/link.png")
        info.external_attr = 0o120777 << 16  # a symbolic link, as Info-ZIP stores one
        zf.writestr(info, "/etc/passwd")
    _refused(path, "symbolic link")


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        (tarfile.SYMTYPE, "is a link"),
        (tarfile.LNKTYPE, "is a link"),
        (tarfile.CHRTYPE, "not a regular file"),
        (tarfile.BLKTYPE, "not a regular file"),
        (tarfile.FIFOTYPE, "not a regular file"),
    ],
)
def test_tar_links_and_devices_are_refused(tmp_path: Path, kind: bytes, match: str) -> None:
    special = tarfile.TarInfo("dark/special.png")
    special.type = kind
    special.linkname = "/etc/passwd"
    _refused(tar_with(tmp_path / "a.tar", special), match)


def test_a_zip_bomb_member_is_refused_by_its_ratio(tmp_path: Path) -> None:
    members = class_members(4) | {"dark/bomb.bmp": bytes(8 * 2**20)}
    _refused(write_zip(tmp_path / "a.zip", members), "ratio limit", error=ArchiveTooLarge)


def test_a_tar_gz_bomb_is_refused_by_its_ratio(tmp_path: Path) -> None:
    members = class_members(4) | {"dark/bomb.bmp": bytes(8 * 2**20)}
    path = write_tar(tmp_path / "a.tar.gz", members, "w:gz")
    _refused(path, "ratio limit", error=ArchiveTooLarge)


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_total_size_and_member_count_are_capped(tmp_path: Path, kind: str) -> None:
    write = write_zip if kind == "zip" else write_tar
    path = write(tmp_path / f"a.{kind}", class_members(6))
    _refused(path, "decompressed", ArchiveLimits(max_total_bytes=1000), ArchiveTooLarge)
    _refused(path, "more than 5 members", ArchiveLimits(max_members=5), ArchiveTooLarge)


def test_decoded_size_is_capped_before_decoding(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "a.zip", class_members(6))
    _refused(path, "decoded", ArchiveLimits(max_decoded_bytes=1000), ArchiveTooLarge)


def test_a_pixel_bomb_is_refused_from_its_header(tmp_path: Path) -> None:
    buf = io.BytesIO()
    Image.new("1", (10000, 5000)).save(buf, format="PNG")  # a few KB, 50 MP decoded
    members = class_members(4) | {"dark/huge.png": buf.getvalue()}
    path = write_zip(tmp_path / "a.zip", members)
    _refused(path, "10000x5000 pixels", error=ArchiveTooLarge)


def test_pillows_own_bomb_check_is_reported(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # > 2x this raises in Image.open
    path = write_zip(tmp_path / "a.zip", class_members(4))
    _refused(path, "decompression bomb", error=ArchiveTooLarge)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"dark/notes.txt": b"hello"}, r"'dark/notes.txt' is not an image"),
        ({"dark/fake.png": b"not a png at all"}, r"'dark/fake.png' is not a readable image"),
        ({"loose.png": png(3)}, r"'loose.png' is not <class folder>/<image file>"),
        ({"dark/deeper/x.png": png(3)}, r"is not <class folder>/<image file>"),
    ],
)
def test_members_that_are_not_class_images_are_named(
    tmp_path: Path, extra: dict, match: str
) -> None:
    _refused(write_zip(tmp_path / "a.zip", class_members(4) | extra), match)


def test_only_the_taken_image_formats_are_decoded(tmp_path: Path) -> None:
    buf = io.BytesIO()
    Image.new("L", (8, 8)).save(buf, format="TIFF")  # a real image, in a format not taken
    members = class_members(4) | {"dark/tiff.png": buf.getvalue()}
    _refused(write_zip(tmp_path / "a.zip", members), r"'dark/tiff.png' is not a readable image")


def test_fewer_than_two_classes_is_refused(tmp_path: Path) -> None:
    one = {k: v for k, v in class_members(4).items() if k.startswith("dark/")}
    _refused(write_zip(tmp_path / "a.zip", one), "only the class 'dark'")
    _refused(write_zip(tmp_path / "b.zip", {}), "no images")


def test_a_member_twice_is_refused(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "a.tar", class_members(4))
    with tarfile.open(path, "a") as tf:
        data = png(9)
        info = tarfile.TarInfo("dark/000.png")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    _refused(path, "twice")


def test_not_an_archive_at_all(tmp_path: Path) -> None:
    (tmp_path / "a.zip").write_bytes(b"PK but not really")
    _refused(tmp_path / "a.zip", "not a readable zip")
    (tmp_path / "b.tar.gz").write_bytes(b"\x1f\x8b garbage")
    _refused(tmp_path / "b.tar.gz", "not a readable tar")
