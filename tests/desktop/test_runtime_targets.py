"""Runtime packs for another machine than the one building them (docs/runtime-packs.md): an
`mps` pack built on Linux from macOS arm64 wheels records the platform and Python it is FOR,
checked against what its wheels are; an agent never installs or uses a pack whose platform or
Python is not its own; and the plan chooser never picks `mps` off an Apple silicon Mac."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from runtime_world import tiny_pack, tiny_site

from desktop.runtime import active, pack, plan, target
from desktop.runtime.store import Store

HERE = target.platform_tag()
# the tests build a fake pack for a platform that is not this one
OTHER = "macosx_arm64" if HERE != "macosx_arm64" else "linux_x86_64"
OTHER_WHEEL = "macosx_14_0_arm64" if OTHER == "macosx_arm64" else "manylinux_2_28_x86_64"
OTHER_EXT = (
    "cpython-311-darwin.so" if OTHER == "macosx_arm64" else "cpython-311-x86_64-linux-gnu.so"
)


def wheel_site(folder: Path, plat: str = OTHER_WHEEL, ext: str = OTHER_EXT,
               python: str = "cp311") -> Path:  # fmt: skip
    """A tiny site-packages whose torch says, as a real wheel does, what it was built for: its
    *.dist-info/WHEEL tag and the compiled core's file name."""
    site = tiny_site(folder)
    info = site / "torch-2.13.0.dist-info"
    info.mkdir()
    (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                                f"Tag: {python}-{python}-{plat}\n")  # fmt: skip
    (site / "torch" / f"_C.{ext}").write_bytes(b"")
    # a pure-Python wheel with two tags, as shellingham's: fits anywhere
    pure = site / "shellingham-1.5.4.dist-info"
    pure.mkdir()
    (pure / "WHEEL").write_text("Tag: py2-none-any\nTag: py3-none-any\n")
    return site


def test_platform_families_and_python_tags() -> None:
    assert target.platform_family("macosx_14_0_arm64") == "macosx_arm64"
    assert target.platform_family("macosx-11.0-arm64") == "macosx_arm64"  # sysconfig's form
    assert target.platform_family("manylinux_2_28_x86_64") == "linux_x86_64"
    assert target.platform_family("manylinux2014_aarch64") == "linux_aarch64"
    assert target.platform_family("win_amd64") == "win_amd64"
    assert target.families("macosx_10_9_universal2") == {"macosx_arm64", "macosx_x86_64"}
    assert target.families("any") == set()
    assert target.python_fits("cp38", "abi3", "cp311")
    assert not target.python_fits("cp312", "abi3", "cp311")
    assert not target.python_fits("cp312", "cp312", "cp311")
    assert target.python_fits("py3", "none", "cp311")


def test_a_pack_for_another_platform_records_it_as_its_wheels_show(tmp_path: Path) -> None:
    site = wheel_site(tmp_path / "b")
    m = pack.build(site, "cpu", tmp_path / "out", platform=OTHER_WHEEL, python="cp311")
    assert (m.platform, m.python) == (OTHER, "cp311")
    assert m.min_os == ("14.0" if OTHER == "macosx_arm64" else "")


def test_a_claim_the_wheels_contradict_is_refused(tmp_path: Path) -> None:
    site = wheel_site(tmp_path / "b")
    # the wheels are for OTHER: packing them as this machine's (the default) is refused
    with pytest.raises(pack.PackError, match=rf"to be for {HERE}, but .* built for {OTHER}"):
        pack.build(site, "cpu", tmp_path / "out")
    with pytest.raises(pack.PackError, match=r"to be for cp312, but .* built for cp311"):
        pack.build(site, "cpu", tmp_path / "out", platform=OTHER, python="cp312")
    # only torch's compiled core tells: it is checked too
    (site / "torch-2.13.0.dist-info" / "WHEEL").unlink()
    with pytest.raises(pack.PackError, match=rf"torch/_C\.{OTHER_EXT} is built for"):
        pack.build(site, "cpu", tmp_path / "out")
    # nothing tells: a claim of another platform cannot be checked, so it is refused
    bare = tiny_site(tmp_path / "bare")
    with pytest.raises(pack.PackError, match=rf"cannot be packed as {OTHER} on this {HERE}"):
        pack.build(bare, "cpu", tmp_path / "out", platform=OTHER)
    assert not list((tmp_path / "out").glob("*.tar.gz"))


@pytest.mark.skipif(HERE == "macosx_arm64", reason="builds an mps pack for another machine")
def test_an_mps_pack_is_for_apple_silicon_only(tmp_path: Path) -> None:
    with pytest.raises(pack.PackError, match=f"an mps pack is for macosx_arm64.*not {HERE}"):
        pack.build(tiny_site(tmp_path / "b"), "mps", tmp_path / "out")
    m = pack.build(wheel_site(tmp_path / "m"), "mps", tmp_path / "out",
                   platform="macosx_arm64", python="cp311")  # fmt: skip
    assert (m.plan, m.platform, m.min_os) == ("mps", "macosx_arm64", "14.0")


def test_pack_cli_takes_the_target_and_says_a_mismatch(tmp_path: Path, capsys) -> None:
    site = wheel_site(tmp_path / "b")
    base = ["build", "--plan", "cpu", "--site-packages", str(site), "--out", str(tmp_path / "o")]
    assert pack.main([*base, "--platform", OTHER, "--python", "cp311"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["platform"], printed["python"]) == (OTHER, "cp311")
    assert pack.main([*base, "--platform", HERE]) == 1
    assert f"build-runtime-pack: the pack is to be for {HERE}" in capsys.readouterr().err


def test_the_store_refuses_a_pack_for_another_machine(tmp_path: Path) -> None:
    m = pack.build(wheel_site(tmp_path / "b"), "cpu", tmp_path / "out", platform=OTHER,
                   python="cp311")  # fmt: skip
    store = Store(tmp_path / "data")
    with pytest.raises(pack.PackError) as err:
        store.install(tmp_path / "out" / m.archive, m)
    # both platforms named
    assert f"built for cp311 {OTHER}; this agent runs {target.python_tag()} {HERE}" in str(
        err.value
    )
    assert store.current() is None and not store.installed()
    assert not (tmp_path / "data" / "runtimes").exists() or not any(
        (tmp_path / "data" / "runtimes").iterdir()
    )


def test_a_foreign_pack_in_the_store_is_never_used(tmp_path: Path, monkeypatch) -> None:
    """A pack whose manifest was changed (or copied in by hand) to another platform: the agent
    runs without it rather than put another machine's packages on a task's path."""
    m = tiny_pack(tmp_path)
    store = Store(tmp_path / "data")
    got = store.install(tmp_path / "out" / m.archive, m)
    monkeypatch.setenv(active.MODE_ENV, "pack")
    assert active.active(tmp_path / "data").site_packages == got.site_packages
    full = got.path / "pack.json"
    os.chmod(got.path, 0o755)
    os.chmod(full, 0o644)
    full.write_text(json.dumps({**m.to_dict(), "platform": OTHER}))
    assert active.active(tmp_path / "data") is None  # pack forced: none usable
    monkeypatch.setenv(active.MODE_ENV, "")
    runtime = active.active(tmp_path / "data")
    assert runtime is None or runtime.source == "environment"


def test_the_plan_chooser_never_picks_mps_off_apple_silicon() -> None:
    published = {p: {} for p in plan.PLANS}
    for system, arch in (("Linux", "x86_64"), ("Linux", "aarch64"), ("Darwin", "x86_64")):
        # even where something claimed an Apple GPU
        machine = plan.Machine(system, arch, apple_gpu=True)
        assert plan.choose(machine, published).plan == "cpu"
        assert not plan.Machine.from_gpus([], system, arch).apple_gpu
    assert plan.choose(plan.Machine("Darwin", "arm64", apple_gpu=True), published).plan == "mps"
    if HERE != "macosx_arm64":
        assert plan.choose(plan.Machine.from_gpus([]), published).plan != "mps"
