"""Exit statuses: defined once in cli.py, documented, and what each failure returns."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import time

import pytest

from rapidmount.daemon import cli
from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard, is_mounted, rapidmount_command, require_fuse, unmount
from tests.polling import until

BUCKET = "exit-bucket"
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

guard = HangGuard(120)
hang_guard = guard.autouse_fixture()


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        emulator.seed(BUCKET, "a.txt", b"a")
        yield emulator


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(rapidmount_command(*args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_exit_codes_are_distinct_and_documented():
    codes = {name: value for name, value in vars(cli).items() if name.startswith("EXIT_")}
    assert sorted(codes.values()) == [0, 1, 2, 3], codes
    section = DOCS.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = dict((int(code), text) for code, text in re.findall(r"^\| `(\d)` \| (.+) \|$", section, re.M))
    assert sorted(documented) == sorted(codes.values())


@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "daemon"])
@pytest.mark.parametrize("case, code, fragment", [
    ("bad-flag", cli.EXIT_USAGE, "--cache-size"),
    ("unknown-option", cli.EXIT_USAGE, "unknown mount option"),
    ("missing-mountpoint", cli.EXIT_CANNOT_MOUNT, "mountpoint does not exist"),
    ("missing-bucket", cli.EXIT_CANNOT_MOUNT, "does not exist"),
    ("unreachable-endpoint", cli.EXIT_CANNOT_MOUNT, "cannot reach the storage endpoint"),
])
def test_failures_exit_with_their_code(emu, tmp_path, case, code, fragment, foreground):
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    endpoint, bucket, extra = emu.endpoint, BUCKET, []
    if case == "bad-flag":
        extra = ["--cache-size", "lots"]
    elif case == "unknown-option":
        extra = ["-o", "no_such_option"]
    elif case == "missing-mountpoint":
        mnt = tmp_path / "absent"
    elif case == "missing-bucket":
        bucket = "no-such-bucket"
    else:
        endpoint, extra = f"127.0.0.1:{_closed_port()}", ["--connect-timeout", "1"]
    mode = ["--foreground"] if foreground else []
    result = _run(*mode, "--anonymous", "--endpoint", endpoint, "--log-file", str(tmp_path / "log"),
                  *extra, bucket, str(mnt))
    unmount(str(mnt))
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rapidmount: error: ") and fragment in lines[0], lines


def test_second_mount_on_the_same_mountpoint_is_refused(emu):
    with guard.mount(emu, BUCKET) as m:
        for mode in (["--foreground"], []):
            result = _run(*mode, "--anonymous", "--endpoint", emu.endpoint, BUCKET, str(m.path))
            assert result.returncode == cli.EXIT_CANNOT_MOUNT
            assert result.stderr.strip() == f"rapidmount: error: mountpoint is already mounted: {m.path}"
        # The first mount is untouched.
        assert (m.path / "a.txt").read_bytes() == b"a" and m.process.poll() is None


def _flock_held(path: pathlib.Path):
    """A check of whether a process holds a flock on ``path`` (the mountpoint
    lock), as /proc/locks lists it; made before anything is mounted over it."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"

    def held() -> bool:
        with open("/proc/locks") as locks:
            return any("FLOCK" in line and inode in line.split() for line in locks)
    return held


def test_two_mounts_started_together_one_wins(tmp_path):
    """The second is refused by the mountpoint lock while the first still connects."""
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with Emulator(buckets={BUCKET: "zonal"}, latency_ms=300) as slow:
        command = rapidmount_command("--foreground", "--anonymous", "--endpoint", slow.endpoint,
                                     "--log-file", str(tmp_path / "log"), BUCKET, str(mnt))
        locked = _flock_held(mnt)
        first = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            until(lambda: locked() or first.poll() is not None, 30, "the first mount's lock")
            assert first.poll() is None, first.stderr.read()
            second = subprocess.run(command, capture_output=True, text=True, timeout=60)
            assert second.returncode == cli.EXIT_CANNOT_MOUNT, second.stderr
            assert second.stderr.strip() in (f"rapidmount: error: mountpoint is in use by another rapidmount: {mnt}",
                                              f"rapidmount: error: mountpoint is already mounted: {mnt}")
            deadline = time.monotonic() + 30
            while not is_mounted(str(mnt)):
                assert first.poll() is None and time.monotonic() < deadline, first.stderr
                time.sleep(0.05)
        finally:
            first.terminate()
            assert first.wait(timeout=30) == cli.EXIT_OK
            unmount(str(mnt))


def test_clean_unmount_exits_0(emu):
    with guard.mount(emu, BUCKET) as m:
        subprocess.run(["fusermount3", "-u", str(m.path)], check=True)
        assert m.process.wait(timeout=30) == cli.EXIT_OK
    with guard.mount(emu, BUCKET) as m:
        m.process.send_signal(signal.SIGINT)
        assert m.process.wait(timeout=30) == cli.EXIT_OK
        assert not is_mounted(str(m.path))


def test_a_sigterm_the_moment_the_mount_appears_unmounts_it_and_exits_0(emu, tmp_path):
    """systemd may stop the unit as soon as it started: a SIGTERM between the
    mount's creation and its first request must unmount, not kill the daemon
    and leave the mountpoint dangling. The window is a few milliseconds, so
    the signal is sent the moment the mount shows, several times."""
    require_fuse()
    for attempt in range(8):
        mnt = tmp_path / f"mnt{attempt}"
        mnt.mkdir()
        daemon = subprocess.Popen(rapidmount_command("--foreground", "--anonymous", "--endpoint", emu.endpoint,
                                                     "--log-file", str(tmp_path / f"log{attempt}"), BUCKET, str(mnt)),
                                  stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not os.path.ismount(mnt):
                assert daemon.poll() is None and time.monotonic() < deadline, "the mount never appeared"
                time.sleep(0.001)
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=30) == cli.EXIT_OK, f"attempt {attempt}"
            assert not is_mounted(str(mnt)), f"attempt {attempt}: the mountpoint was left mounted"
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
            unmount(str(mnt))
