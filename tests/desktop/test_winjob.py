"""Windows job objects: the limits' layout and flags (everywhere), the real thing on Windows."""

from __future__ import annotations

import ctypes
import struct
import sys

import pytest

from desktop import winjob
from desktop.sandbox import Limits, Sandbox


def test_structures_have_the_windows_x64_layout() -> None:
    if struct.calcsize("P") != 8:
        pytest.skip("the documented sizes are for 64-bit Windows")
    assert ctypes.sizeof(winjob.JOBOBJECT_BASIC_LIMIT_INFORMATION) == 64
    assert ctypes.sizeof(winjob.IO_COUNTERS) == 48
    assert ctypes.sizeof(winjob.JOBOBJECT_EXTENDED_LIMIT_INFORMATION) == 144
    assert winjob.JOBOBJECT_EXTENDED_LIMIT_INFORMATION.JobMemoryLimit.offset == 120


def test_limits_become_job_flags() -> None:
    info = winjob.limit_info(Limits(memory_mb=512, cpu_s=30), cap_memory=True)
    basic = info.BasicLimitInformation
    assert basic.LimitFlags & winjob.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    assert basic.LimitFlags & winjob.JOB_OBJECT_LIMIT_JOB_MEMORY
    assert info.JobMemoryLimit == 512 * 2**20
    assert basic.PerJobUserTimeLimit == 30 * 10_000_000  # 100 ns units
    assert basic.ActiveProcessLimit == winjob.MAX_PROCESSES
    gpu = winjob.limit_info(Limits(memory_mb=512, cpu_s=30), cap_memory=False)
    assert not gpu.BasicLimitInformation.LimitFlags & winjob.JOB_OBJECT_LIMIT_JOB_MEMORY


def test_job_objects_are_refused_off_windows() -> None:
    if sys.platform == "win32":
        pytest.skip("this is Windows")
    with pytest.raises(OSError, match="only on Windows"):
        winjob.JobObject(Limits(), cap_memory=True)


@pytest.mark.skipif(sys.platform != "win32", reason="needs Windows")
def test_a_task_over_its_memory_is_stopped_by_the_job(tmp_path) -> None:
    sandbox = Sandbox(Limits(memory_mb=256, cpu_s=30, wall_s=60), use_bwrap=False)
    hog = "x = bytearray(1024 * 2**20); print(len(x))"
    result = sandbox.run(tmp_path, [sys.executable, "-c", hog])
    assert not result.ok
