from __future__ import annotations

import shutil

import pytest

from tests.system.harness import System


@pytest.fixture
def system(tmp_path):
    made: list[System] = []

    def make(**kwargs) -> System:
        s = System(tmp_path / "cluster", **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
    shutil.rmtree(tmp_path / "cluster", ignore_errors=True)
