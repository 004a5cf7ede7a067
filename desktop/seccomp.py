"""The task's system-call filter: no namespaces, no mounts (a classic-BPF seccomp program).

A task that makes a user namespace gets every capability inside it, and with them mounts of
its own: a tmpfs it fills is host memory that no resident set shows, past its memory limit
(#38). bubblewrap's `--disable-userns` stops new user namespaces only where bwrap made one
itself (not for a root agent, which runs tasks without one, desktop/sandbox.py), so every task
also gets this filter, which bwrap loads (`--seccomp FD`) before it starts the task; the warm
worker's children inherit it with the fork. Refused with EPERM:

- unshare and clone with any CLONE_NEW* flag, and setns;
- mount, umount2, pivot_root, and the new mount API (open_tree, move_mount, fsopen, fsconfig,
  fsmount, fspick, mount_setattr);
- every call of another ABI than the machine's own (i386 or x32 on x86_64, arm32 on aarch64),
  whose numbers the checks above would not match.

clone3 passes its flags in memory, where a filter cannot look: it answers ENOSYS, and the C
library falls back to clone, whose flags are checked. Written by hand (struct, no libseccomp):
the program is small and the agent's environment need not have the bindings.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import struct
import sys

# linux/audit.h
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# linux/sched.h: every namespace a task could make
CLONE_NEW = {
    "CLONE_NEWTIME": 0x00000080, "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000,
}  # fmt: skip
NAMESPACE_FLAGS = sum(CLONE_NEW.values())

# system-call numbers: arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h
SYSCALLS = {
    "x86_64": {
        "clone": 56, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "clone3": 435, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    },
    "aarch64": {
        "clone": 220, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "clone3": 435, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    },
}  # fmt: skip
REFUSED = ("setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen",
           "fsconfig", "fsmount", "fspick", "mount_setattr")  # fmt: skip
FLAGS_CHECKED = ("unshare", "clone")  # refused only with a CLONE_NEW* flag (their first argument)

# linux/filter.h, linux/seccomp.h
BPF_LD_W_ABS = 0x20
BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K = 0x15, 0x35, 0x45
BPF_RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
NR_AT, ARCH_AT, ARGS_AT = 0, 4, 16


def machine() -> str | None:
    """The machine's name as this module knows it, or None where no filter is written for it."""
    name = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(),
                                                       platform.machine().lower())  # fmt: skip
    return name if sys.platform.startswith("linux") and name in AUDIT_ARCH else None


def program(arch: str) -> bytes:
    """The filter for `arch` ("x86_64" or "aarch64"): struct sock_filter[] as bwrap reads it."""
    nr = SYSCALLS[arch]
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    # the first argument's low 32 bits hold every CLONE_NEW* flag
    low_word = ARGS_AT + (0 if sys.byteorder == "little" else 4)
    code: list[Instruction] = [
        ("", BPF_LD_W_ABS, 0, 0, ARCH_AT),
        ("", BPF_JEQ_K, 0, "deny", AUDIT_ARCH[arch]),
        ("", BPF_LD_W_ABS, 0, 0, NR_AT),
    ]
    if arch == "x86_64":  # the x32 ABI shares the arch value: its numbers carry this bit
        code.append(("", BPF_JGE_K, "deny", 0, X32_SYSCALL_BIT))
    code.append(("", BPF_JEQ_K, "enosys", 0, nr["clone3"]))
    code += [("", BPF_JEQ_K, "deny", 0, nr[name]) for name in REFUSED]
    code += [("", BPF_JEQ_K, "flags", 0, nr[name]) for name in FLAGS_CHECKED]
    code += [
        ("", BPF_RET_K, 0, 0, RET_ALLOW),
        ("flags", BPF_LD_W_ABS, 0, 0, low_word),
        ("", BPF_JSET_K, "deny", 0, NAMESPACE_FLAGS),
        ("", BPF_RET_K, 0, 0, RET_ALLOW),
        ("deny", BPF_RET_K, 0, 0, eperm),
        ("enosys", BPF_RET_K, 0, 0, enosys),
    ]
    return _assemble(code)


# (label or "", opcode, jump if true, jump if false, k); a jump names the label it goes to
Instruction = tuple[str, int, "int | str", "int | str", int]


def _assemble(code: list[Instruction]) -> bytes:
    """The instructions as struct sock_filter bytes, each jump a forward offset to its label."""
    labels = {label: i for i, (label, *_) in enumerate(code) if label}
    out = bytearray()
    for i, (_, op, jt, jf, k) in enumerate(code):
        offsets = [labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= o <= 255 for o in offsets), "a jump out of a classic BPF's reach"
        out += struct.pack("=HBBI", op, offsets[0], offsets[1], k)
    return bytes(out)


def filter_fd() -> int | None:
    """A readable descriptor holding this machine's filter, for bwrap's `--seccomp FD` (the
    caller passes it to bwrap and closes it); None where no filter is written for the machine."""
    arch = machine()
    if arch is None:
        return None
    data = program(arch)
    fd = os.memfd_create("gpuflex-seccomp", 0) if hasattr(os, "memfd_create") else None
    if fd is None:
        r, w = os.pipe()  # a pipe's buffer holds far more than the program
        with contextlib.closing(os.fdopen(w, "wb")) as f:
            f.write(data)
        return r
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
