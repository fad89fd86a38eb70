"""The kernel settings a live mount gets: read_ahead_kb, and max_background and
congestion_threshold through fusectl (mounted by the daemon when absent).

They need root and the FUSE control file system: under ``CI=true`` a machine
that cannot provide them fails these tests; elsewhere they skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import time

import pytest

from rapidmount.daemon import serve as daemon
from rapidmount.daemon.config import default_max_background
from rapidmount.emulator import Emulator
from tests.mountutil import MOUNT_TIMEOUT, HangGuard, rapidmount_command, require_fuse, stop_process

BUCKET = "kernel-bucket"
_run = subprocess.run  # not the patched one, in cleanups
KERNEL_MAX_BACKGROUND, KERNEL_CONGESTION_THRESHOLD = 12, 9  # FUSE_DEFAULT_MAX_BACKGROUND, 3/4 of it

guard = HangGuard(120)
hang_guard = guard.autouse_fixture()


def _require_root() -> None:
    require_fuse()
    if os.geteuid() == 0:
        return
    if os.environ.get("CI"):
        pytest.fail("kernel settings need root under CI")
    pytest.skip("kernel settings need root")


def _fusectl() -> pathlib.Path:
    """The host's fusectl, mounted if needed; a machine without it fails under CI."""
    why = daemon.ensure_fusectl()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount fusectl on {daemon.FUSECTL_ROOT} under CI: {why}")
        pytest.skip(f"cannot mount fusectl: {why}")
    return pathlib.Path(daemon.FUSECTL_ROOT)


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        emulator.seed(BUCKET, "a.txt", b"abc")
        yield emulator


def _knobs(mnt: pathlib.Path, mountinfo: str = "/proc/self/mountinfo") -> dict[str, int]:
    bdi = daemon._bdi_of(str(mnt), mountinfo)
    assert bdi is not None, f"{mnt} is not in {mountinfo}"
    connection = _fusectl() / str(daemon.fuse_connection_id(bdi))
    assert connection.is_dir(), f"no fusectl directory {connection} for {mnt} ({bdi})"
    with open(f"/sys/class/bdi/{bdi}/read_ahead_kb") as read_ahead:
        knobs = {"read_ahead_kb": int(read_ahead.read())}
    for name in ("max_background", "congestion_threshold"):
        knobs[name] = int((connection / name).read_text())
    return knobs


def test_connection_id_names_the_mounts_fusectl_directory(emu):
    _require_root()
    with guard.mount(emu, BUCKET) as m:
        device = os.stat(m.path).st_dev
        bdi = daemon._bdi_of(str(m.path))
        assert bdi == f"{os.major(device)}:{os.minor(device)}"
        assert daemon.fuse_connection_id(bdi) == os.minor(device)
        assert (_fusectl() / str(os.minor(device)) / "waiting").exists()


def test_defaults_set_gcsfuses_zonal_limits_and_keep_read_ahead(emu):
    _require_root()
    with guard.mount(emu, BUCKET) as m:
        expected = default_max_background()
        assert _knobs(m.path) == {"read_ahead_kb": 1024, "max_background": expected,
                                  "congestion_threshold": expected * 3 // 4}
        assert (f"FUSE max_background {expected}, congestion_threshold {expected * 3 // 4} for {m.path}"
                in m.log())
        assert (m.path / "a.txt").read_bytes() == b"abc"


def test_explicit_values_from_flags_and_options(emu):
    _require_root()
    with guard.mount(emu, BUCKET, "--max-background", "64", "-o", "congestion_threshold=40",
                     "--kernel-read-ahead-kb", "4096") as m:
        assert _knobs(m.path) == {"read_ahead_kb": 4096, "max_background": 64, "congestion_threshold": 40}
        assert "FUSE max_background 64, congestion_threshold 40" in m.log()


def test_threshold_follows_an_explicit_max_background(emu):
    _require_root()
    with guard.mount(emu, BUCKET, "--max-background", "200") as m:
        assert _knobs(m.path) == {"read_ahead_kb": 1024, "max_background": 200, "congestion_threshold": 150}


def test_zero_leaves_the_kernels_defaults(emu):
    _require_root()
    with guard.mount(emu, BUCKET, "--max-background", "0") as m:
        assert _knobs(m.path) == {"read_ahead_kb": 1024, "max_background": KERNEL_MAX_BACKGROUND,
                                  "congestion_threshold": KERNEL_CONGESTION_THRESHOLD}
        assert "FUSE max_background" not in m.log()


def test_daemon_mounts_fusectl_when_absent(emu, tmp_path):
    """In a mount namespace of its own without fusectl, the daemon mounts it, then sets the knobs."""
    _require_root()
    _fusectl()  # the test reads the knobs through the host's fusectl (the connections are global)
    unshare = shutil.which("unshare")
    if unshare is None:
        if os.environ.get("CI"):
            pytest.fail("unshare(1) is missing under CI")
        pytest.skip("unshare(1) is missing")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log_path = tmp_path / "daemon.log"
    command = rapidmount_command("--foreground", "--anonymous", "--endpoint", emu.endpoint,
                                 "--log-file", str(log_path), "--log-level", "debug", "--max-background", "100",
                                 BUCKET, str(mnt))
    # unshare execs (no fork), so the Popen's pid is the daemon's, in the new namespace.
    script = f'umount {daemon.FUSECTL_ROOT} && exec "$@"'
    process = subprocess.Popen([unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                *command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    mountinfo = f"/proc/{process.pid}/mountinfo"
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while "mounted gs://" not in (log_path.read_text() if log_path.exists() else ""):
            if process.poll() is not None:
                pytest.fail(f"rapidmount exited with {process.returncode}: "
                            f"{process.stderr.read().decode(errors='replace')}\n{log_path.read_text()}")
            assert time.monotonic() < deadline, f"no mount within {MOUNT_TIMEOUT}s\n{log_path.read_text()}"
            time.sleep(0.05)
        fusectl_mounts = [line for line in open(mountinfo) if " - fusectl " in line]
        assert [line.split()[4] for line in fusectl_mounts] == [daemon.FUSECTL_ROOT], (
            "the daemon did not mount fusectl in its namespace")
        assert _knobs(mnt, mountinfo) == {"read_ahead_kb": 1024, "max_background": 100,
                                          "congestion_threshold": 75}
        assert "FUSE max_background 100, congestion_threshold 75" in log_path.read_text()
        assert f"mounted fusectl on {daemon.FUSECTL_ROOT}" in log_path.read_text()
    finally:
        stop_process(process)


@contextlib.contextmanager
def _scratch_mount_point(tmp_path: pathlib.Path, name: str):
    point = tmp_path / name
    point.mkdir()
    try:
        yield str(point)
    finally:
        if os.path.ismount(point):
            _run(["umount", str(point)], check=False, timeout=30)


def test_ensure_fusectl_mounts_with_mount8_and_without_it(tmp_path, monkeypatch):
    """Both ways of mounting fusectl, on scratch directories (the host's mount stays as it is)."""
    _require_root()
    _fusectl()
    with _scratch_mount_point(tmp_path, "by-mount8") as point:
        assert daemon.ensure_fusectl(point) is None
        assert os.path.ismount(point)
        assert daemon.ensure_fusectl(point) is None  # already there: nothing to do

    def no_mount_binary(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "mount")

    monkeypatch.setattr(daemon.subprocess, "run", no_mount_binary)
    with _scratch_mount_point(tmp_path, "by-syscall") as point:
        assert daemon.ensure_fusectl(point) is None
        assert os.path.ismount(point)
