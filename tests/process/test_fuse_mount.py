"""``rapidmount.fuse.mount`` mounting for real: by mount(2) and by fusermount3.

Nothing answers the kernel's INIT here, and until something does a stat of
the mountpoint blocks: these tests look at /proc/self/mountinfo and at the
descriptor instead, never at the mountpoint. Each mount is lazily unmounted
when its test ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from rapidmount.fuse.mount import MountFailed, Mounted, MountOptions, open_and_mount, unmount
from tests.mountutil import require_fuse

pytestmark = pytest.mark.process

REPO = pathlib.Path(__file__).resolve().parents[2]
FSNAME = "rapidmount:test-bucket"
IN_HEADER = struct.Struct("<IIQQIIIHH")  # fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, extlen, padding
FUSE_INIT = 26
DEADLINE = 10.0  # seconds for what the kernel or fusermount3 does at once


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""

    mount_options: frozenset[str]
    fstype: str
    source: str
    super_options: frozenset[str]


def mount_entry(path: str) -> MountEntry | None:
    """The top mount on ``path`` (a real path), from /proc/self/mountinfo: no stat of the mountpoint."""
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), fields[4])
            if point == path:
                rest = fields[fields.index("-") + 1:]
                found = MountEntry(frozenset(fields[5].split(",")), rest[0], rest[1], frozenset(rest[2].split(",")))
    return found


def wait_until_unmounted(path: str) -> bool:
    deadline = time.monotonic() + DEADLINE
    while mount_entry(path) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def lazy_unmount_leftover(path: str) -> None:
    if mount_entry(path) is not None:
        subprocess.run(["fusermount3", "-u", "-z", "--", path], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def require_root() -> None:
    """mount(2) and an unmount by umount2 need root; under CI its absence fails the test."""
    if os.geteuid() == 0:
        return
    if os.environ.get("CI"):
        pytest.fail("cannot mount(2) under CI: not root")
    pytest.skip("mount(2) needs root")


def read_request(fd: int) -> bytes:
    """The next request the kernel queued on ``fd``, without blocking past the deadline."""
    readable, _, _ = select.select([fd], [], [], DEADLINE)
    assert readable, f"the kernel sent nothing on /dev/fuse within {DEADLINE:g} s"
    return os.read(fd, 1 << 20)


def assert_init_request(fd: int) -> None:
    request = read_request(fd)
    length, opcode, *_ = IN_HEADER.unpack_from(request)
    assert opcode == FUSE_INIT and length == len(request) > IN_HEADER.size
    major = struct.unpack_from("<I", request, IN_HEADER.size)[0]
    assert major == 7, f"FUSE protocol {major}"


@pytest.fixture
def scratch(tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(os.path.realpath(tmp_path))  # mountinfo lists real paths


@pytest.fixture
def mount_on(scratch: pathlib.Path) -> Iterator[Callable[[MountOptions], tuple[str, Mounted]]]:
    """Mount on a fresh directory; unmounted and closed when the test ends."""
    require_fuse()
    made: list[tuple[str, Mounted]] = []

    def mount_on(options: MountOptions) -> tuple[str, Mounted]:
        path = scratch / f"mnt{len(made)}"
        path.mkdir()
        mounted = open_and_mount(str(path), options)
        made.append((str(path), mounted))
        return str(path), mounted

    yield mount_on
    for path, mounted in made:
        try:
            with contextlib.suppress(MountFailed):
                unmount(path, mounted)
        finally:
            mounted.close()
            lazy_unmount_leftover(path)


def test_mount_syscall_mounts_with_the_options_and_the_kernel_sends_init(mount_on):
    require_root()
    options = MountOptions(fsname=FSNAME, read_only=True, allow_other=True, default_permissions=True,
                           auto_unmount=False)
    path, mounted = mount_on(options)
    assert mounted.mounted_by == "mount(2)" and mounted.auto_unmount_socket is None
    assert not os.get_inheritable(mounted.fd)
    entry = mount_entry(path)
    assert entry is not None and entry.fstype == "fuse.rapidmount" and entry.source == FSNAME
    assert {"ro", "nosuid", "nodev", "noatime"} <= entry.mount_options
    assert {f"user_id={os.getuid()}", f"group_id={os.getgid()}", "allow_other",
            "default_permissions"} <= entry.super_options
    assert_init_request(mounted.fd)
    unmount(path, mounted)
    assert mount_entry(path) is None and mounted.closed
    unmount(path, mounted)  # idempotent


def test_fusermount3_mounts_with_auto_unmount_and_keeps_its_socket(mount_on):
    path, mounted = mount_on(MountOptions(fsname=FSNAME))
    socket_end, helper = mounted.auto_unmount_socket, mounted.auto_unmount_helper
    assert mounted.mounted_by == "fusermount3" and socket_end is not None and helper is not None
    assert not os.get_inheritable(mounted.fd) and not socket_end.get_inheritable()
    assert helper.poll() is None, "fusermount3 stopped waiting on the auto_unmount socket"
    entry = mount_entry(path)
    assert entry is not None and entry.fstype == "fuse.rapidmount" and entry.source == FSNAME
    assert {"rw", "nosuid", "nodev", "noatime"} <= entry.mount_options
    assert f"user_id={os.getuid()}" in entry.super_options
    assert not {"allow_other", "default_permissions"} & entry.super_options
    assert_init_request(mounted.fd)
    unmount(path, mounted)
    assert mount_entry(path) is None
    assert helper.returncode == 0 and socket_end.fileno() == -1, "fusermount3 is left a zombie or its socket open"
    unmount(path, mounted)  # idempotent


def test_an_unmount_from_outside_is_no_error(mount_on):
    path, mounted = mount_on(MountOptions(fsname=FSNAME))
    subprocess.run(["fusermount3", "-u", "-z", "--", path], check=True)
    assert mount_entry(path) is None
    unmount(path, mounted)
    assert mounted.closed


CHILD = """
import sys
from rapidmount.fuse.mount import MountOptions, open_and_mount
open_and_mount(sys.argv[1], MountOptions(fsname=sys.argv[2]))
print("mounted", flush=True)
sys.stdin.read()
"""


def test_auto_unmount_unmounts_when_the_mounting_process_is_killed(scratch: pathlib.Path):
    require_fuse()
    path = scratch / "mnt"
    path.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with subprocess.Popen([sys.executable, "-c", CHILD, str(path), FSNAME], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env) as child:
        try:
            assert child.stdout is not None and child.stderr is not None
            readable, _, _ = select.select([child.stdout], [], [], 60)
            if not readable or child.stdout.readline() != b"mounted\n":
                child.kill()
                pytest.fail(f"the child did not mount: {child.stderr.read().decode(errors='replace')}")
            assert mount_entry(str(path)) is not None
            child.send_signal(signal.SIGKILL)
            child.wait()
            assert wait_until_unmounted(str(path)), f"fusermount3 did not unmount within {DEADLINE:g} s"
        finally:
            child.kill()
            lazy_unmount_leftover(str(path))
        lazy_unmount_leftover(str(path))


def test_a_dead_fuse_mountpoint_is_refused_in_one_line(mount_on):
    require_root()
    path, mounted = mount_on(MountOptions(fsname=FSNAME, auto_unmount=False))
    mounted.close()  # the connection is aborted: the mount stays, dead
    with pytest.raises(MountFailed, match="Transport endpoint is not connected") as failure:
        open_and_mount(path, MountOptions(fsname=FSNAME))
    assert "\n" not in str(failure.value)


def test_an_already_mounted_mountpoint_is_refused(scratch: pathlib.Path):
    require_root()
    path = str(scratch)
    subprocess.run(["mount", "-t", "tmpfs", "rapidmount-test", path], check=True)
    try:
        with pytest.raises(MountFailed, match="already mounted"):
            open_and_mount(path, MountOptions(fsname=FSNAME))
    finally:
        subprocess.run(["umount", "-l", path], check=True)


def test_a_missing_mountpoint_or_a_file_is_refused(scratch: pathlib.Path):
    with pytest.raises(MountFailed, match="does not exist"):
        open_and_mount(str(scratch / "missing"), MountOptions(fsname=FSNAME))
    (scratch / "file").touch()
    with pytest.raises(MountFailed, match="not a directory"):
        open_and_mount(str(scratch / "file"), MountOptions(fsname=FSNAME))


def fake_fusermount3(directory: pathlib.Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``fusermount3`` first in PATH that runs ``script`` instead of mounting."""
    directory.mkdir()
    program = directory / "fusermount3"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")


def test_a_fusermount3_failure_is_one_line_with_what_it_said(scratch: pathlib.Path, monkeypatch):
    fake_fusermount3(scratch / "bin", 'echo "fusermount3: mount failed: Operation not permitted" >&2\n'
                                      'echo "fusermount3: second line" >&2\nexit 1', monkeypatch)
    (scratch / "mnt").mkdir()
    with pytest.raises(MountFailed) as failure:
        open_and_mount(str(scratch / "mnt"), MountOptions(fsname=FSNAME))
    message = str(failure.value)
    assert "\n" not in message and str(scratch / "mnt") in message
    assert "mount failed: Operation not permitted" in message and "second line" in message


def test_a_fusermount3_that_sends_nothing_times_out_and_is_killed(scratch: pathlib.Path, monkeypatch):
    fake_fusermount3(scratch / "bin", 'echo $$ > "$0.pid"\nexec sleep 60', monkeypatch)
    (scratch / "mnt").mkdir()
    started = time.monotonic()
    with pytest.raises(MountFailed, match="within 0.5 s"):
        open_and_mount(str(scratch / "mnt"), MountOptions(fsname=FSNAME), timeout=0.5)
    assert time.monotonic() - started < DEADLINE
    pid = int((scratch / "bin" / "fusermount3.pid").read_text())
    assert not pathlib.Path(f"/proc/{pid}").exists(), "the fake fusermount3 was neither killed nor reaped"
