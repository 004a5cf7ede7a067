"""The task's seccomp filter (desktop/seccomp.py), on both machines it is written for.

The bwrap tests (test_sandbox_folder_escapes.py) run the filter of the machine they run on;
these run the program of each machine through a small classic-BPF interpreter, so the
aarch64 filter is checked on an x86_64 machine too, and the other way round.
"""

from __future__ import annotations

import errno
import struct

import pytest

from desktop import seccomp
from desktop.seccomp import AUDIT_ARCH, CLONE_NEW, SYSCALLS, program

ALLOW = "allow"
SIGCHLD = 17
CLONE_VM_VFORK = 0x00000100 | 0x00004000
PTHREAD_FLAGS = 0x3D0F00  # glibc's pthread_create: CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|...


def verdict(code: bytes, arch: int, nr: int, *args: int) -> str | int:
    """What the filter answers for one call: ALLOW, or the errno it returns."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    ins = [struct.unpack_from("=HBBI", code, i) for i in range(0, len(code), 8)]
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = ins[pc]
        pc += 1
        if op == seccomp.BPF_LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
        elif op in (seccomp.BPF_JEQ_K, seccomp.BPF_JGE_K, seccomp.BPF_JSET_K):
            hit = {seccomp.BPF_JEQ_K: acc == k, seccomp.BPF_JGE_K: acc >= k,
                   seccomp.BPF_JSET_K: bool(acc & k)}[op]  # fmt: skip
            pc += jt if hit else jf
        elif op == seccomp.BPF_RET_K:
            if k == seccomp.RET_ALLOW:
                return ALLOW
            assert k & 0xFFFF0000 == seccomp.RET_ERRNO
            return k & 0xFFFF
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_namespaces_and_mounts_are_refused_and_the_rest_passes(machine: str) -> None:
    code, arch, nr = program(machine), AUDIT_ARCH[machine], SYSCALLS[machine]
    for flag, value in CLONE_NEW.items():
        assert verdict(code, arch, nr["unshare"], value) == errno.EPERM, flag
        assert verdict(code, arch, nr["clone"], value | SIGCHLD) == errno.EPERM, flag
    user_and_mount = CLONE_NEW["CLONE_NEWUSER"] | CLONE_NEW["CLONE_NEWNS"]
    assert verdict(code, arch, nr["unshare"], user_and_mount) == errno.EPERM
    for name in seccomp.REFUSED:
        assert verdict(code, arch, nr[name]) == errno.EPERM, name
    assert verdict(code, arch, nr["clone3"]) == errno.ENOSYS  # glibc falls back to clone
    # what tasks do: fork, vfork-spawn, threads, unshare of their own file table
    assert verdict(code, arch, nr["clone"], SIGCHLD) == ALLOW
    assert verdict(code, arch, nr["clone"], CLONE_VM_VFORK | SIGCHLD) == ALLOW
    assert verdict(code, arch, nr["clone"], PTHREAD_FLAGS) == ALLOW
    assert verdict(code, arch, nr["unshare"], 0x00000400) == ALLOW  # CLONE_FILES
    for other in (0, 1, 63, 200, 300):  # read, write, ... whatever they are on this machine
        if other not in nr.values():
            assert verdict(code, arch, other) == ALLOW


def test_other_abis_are_refused_whole() -> None:
    """An i386 or arm32 call (int 0x80, compat mode) or an x32 one: numbers of another
    table, which the checks by number would miss."""
    x86, arm = program("x86_64"), program("aarch64")
    assert verdict(x86, 0x40000003, 310, CLONE_NEW["CLONE_NEWUSER"]) == errno.EPERM  # i386
    assert verdict(x86, 0x40000003, 20) == errno.EPERM
    x32_unshare = 0x40000000 | 272
    assert verdict(x86, AUDIT_ARCH["x86_64"], x32_unshare, 0x10000000) == errno.EPERM
    assert verdict(arm, 0x40000028, 337, CLONE_NEW["CLONE_NEWUSER"]) == errno.EPERM  # arm32
    assert verdict(arm, AUDIT_ARCH["x86_64"], 1) == errno.EPERM


def test_the_filter_reaches_bwrap_as_a_readable_descriptor() -> None:
    import os

    if seccomp.machine() is None:
        pytest.skip("no filter written for this machine")
    fd = seccomp.filter_fd()
    assert fd is not None
    try:
        data = b""
        while chunk := os.read(fd, 4096):
            data += chunk
    finally:
        os.close(fd)
    assert data == program(seccomp.machine() or "") and len(data) % 8 == 0


@pytest.mark.parametrize("as_root", [True, False])
def test_every_bwrap_sandbox_loads_the_filter(
    as_root: bool, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root agent or not, the filter is loaded; a non-root agent's bwrap (which makes the
    task's user namespace) also forbids any further one, where that bwrap can."""
    from desktop import sandbox

    if sandbox.bwrap_path() is None:
        pytest.skip("bubblewrap missing")
    monkeypatch.setattr(sandbox, "_as_root", lambda: as_root)
    monkeypatch.setattr(sandbox, "_tool", lambda name: f"/usr/bin/{name}")
    monkeypatch.setitem(sandbox._BWRAP_DISABLES_USERNS, sandbox.bwrap_path(), True)
    argv = sandbox.bwrap_argv(tmp_path, ["true"], gpu=False, folder_fd=7, seccomp_fd=9)
    assert argv[argv.index("--seccomp") + 1] == "9"
    assert argv[argv.index("--bind-fd") + 1 : argv.index("--bind-fd") + 3] == ["7", str(tmp_path)]
    assert ("--disable-userns" in argv) is (not as_root)
    if not as_root:
        assert "--unshare-user" in argv
