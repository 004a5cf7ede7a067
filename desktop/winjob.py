"""Windows Job Objects: the task's CPU time, memory and process count, enforced by the kernel.

On Windows there are no rlimits; a job object holding the task process caps its committed
memory (JOB_OBJECT_LIMIT_JOB_MEMORY) and user-mode CPU time (JOB_OBJECT_LIMIT_JOB_TIME),
limits how many processes it may start, and kills every process in it when the agent closes
the job's handle or crashes (JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE). The structures follow
winnt.h; `limit_info` is plain data so the layout and flags are tested on every platform.
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import wintypes
from typing import Protocol


class Limits(Protocol):
    """What a job object enforces of desktop.sandbox.Limits (which imports this module)."""

    @property
    def memory_mb(self) -> int: ...

    @property
    def cpu_s(self) -> int: ...


JOB_OBJECT_LIMIT_JOB_TIME = 0x00000004
JOB_OBJECT_LIMIT_ACTIVE_PROCESS = 0x00000008
JOB_OBJECT_LIMIT_JOB_MEMORY = 0x00000200
JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION = 0x00000400
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS = 9
MAX_PROCESSES = 16  # the runner and the worker processes a data loader may start
HUNDRED_NS_PER_S = 10_000_000


class IO_COUNTERS(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "ReadOperationCount", "WriteOperationCount", "OtherOperationCount",
        "ReadTransferCount", "WriteTransferCount", "OtherTransferCount",
    )]  # fmt: skip


class JOBOBJECT_BASIC_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", ctypes.c_longlong),
        ("PerJobUserTimeLimit", ctypes.c_longlong),
        ("LimitFlags", ctypes.c_uint32),
        ("MinimumWorkingSetSize", ctypes.c_size_t),
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", ctypes.c_uint32),
        ("Affinity", ctypes.c_size_t),
        ("PriorityClass", ctypes.c_uint32),
        ("SchedulingClass", ctypes.c_uint32),
    ]


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
        ("IoInfo", IO_COUNTERS),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    ]


def limit_info(limits: Limits, cap_memory: bool) -> JOBOBJECT_EXTENDED_LIMIT_INFORMATION:
    """The job's limits: GPU tasks skip the commit cap (drivers reserve huge mappings) and
    rely on the agent's resident-memory watchdog, as on Linux."""
    info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
    basic = info.BasicLimitInformation
    basic.LimitFlags = (
        JOB_OBJECT_LIMIT_JOB_TIME
        | JOB_OBJECT_LIMIT_ACTIVE_PROCESS
        | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION
        | JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    )
    basic.PerJobUserTimeLimit = int(limits.cpu_s) * HUNDRED_NS_PER_S
    basic.ActiveProcessLimit = MAX_PROCESSES
    if cap_memory:
        basic.LimitFlags |= JOB_OBJECT_LIMIT_JOB_MEMORY
        info.JobMemoryLimit = int(limits.memory_mb) * 2**20
    return info


class JobObject:
    """A job object with `limits` that processes are assigned to; closing it kills them."""

    def __init__(self, limits: Limits, cap_memory: bool) -> None:
        if sys.platform != "win32":
            raise OSError("job objects exist only on Windows")
        self._k32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        self._k32.CreateJobObjectW.restype = wintypes.HANDLE
        self.handle = self._k32.CreateJobObjectW(None, None)
        if not self.handle:
            raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
        info = limit_info(limits, cap_memory)
        ok = self._k32.SetInformationJobObject(
            self.handle, JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
            ctypes.byref(info), ctypes.sizeof(info),
        )  # fmt: skip
        if not ok:
            self.close()
            raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]

    def assign(self, process_handle: int) -> None:
        if not self._k32.AssignProcessToJobObject(self.handle, wintypes.HANDLE(process_handle)):
            raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]

    def terminate(self, exit_code: int = 1) -> None:
        self._k32.TerminateJobObject(self.handle, exit_code)

    def close(self) -> None:
        if self.handle:
            self._k32.CloseHandle(self.handle)  # KILL_ON_JOB_CLOSE: nothing survives it
            self.handle = None
