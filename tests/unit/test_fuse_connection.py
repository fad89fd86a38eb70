"""Finding a mount's FUSE connection and choosing its kernel limits (no mount, no root)."""

from __future__ import annotations

import logging
import os

import pytest

from rapidmount.daemon import serve as daemon
from rapidmount.daemon.config import ConfigError, GivenSettings, apply_mount_options, default_max_background


def test_connection_id_is_the_minor_of_an_anonymous_device():
    assert daemon.fuse_connection_id("0:52") == 52
    assert daemon.fuse_connection_id("0:1048575") == 1048575


def test_connection_id_of_a_block_device_uses_the_kernel_dev_t():
    # fuseblk mounts have a real major: the kernel names the directory MKDEV(major, minor).
    assert daemon.fuse_connection_id("8:17") == 8 << 20 | 17


@pytest.mark.parametrize("bad", ["", "52", "0:", ":5", "a:b", "0:5:1"])
def test_connection_id_rejects_what_is_not_major_minor(bad):
    with pytest.raises(ValueError):
        daemon.fuse_connection_id(bad)


def test_bdi_of_reads_mountinfo_with_escapes_and_stacked_mounts(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        "40 27 0:39 / /mnt/my\\040data rw,nosuid,nodev - fuse.rapidmount rapidmount:b rw,user_id=0\n"
        "41 27 0:40 / /mnt/x rw,nosuid,nodev - fuse.rapidmount rapidmount:b rw,user_id=0\n"
        "44 41 0:47 / /mnt/x rw,nosuid,nodev - fuse.rapidmount rapidmount:c rw,user_id=0\n")
    assert daemon._bdi_of("/mnt/my data", str(info)) == "0:39"
    assert daemon._bdi_of("/mnt/x", str(info)) == "0:47"  # the mount on top
    assert daemon._bdi_of("/mnt/none", str(info)) is None


def test_default_max_background_is_gcsfuses_zonal_rule():
    assert [default_max_background(cpus) for cpus in (1, 2, 6, 8, 64, 96, 192)] == [12, 12, 12, 16, 128, 192, 192]
    assert 12 <= default_max_background() <= 192


def _limits(*options: str) -> tuple[int, int]:
    given = GivenSettings()
    apply_mount_options(given, list(options))
    return given.build("b", "/mnt").effective_fuse_limits


def test_effective_limits():
    auto = default_max_background()
    assert _limits() == (auto, auto * 3 // 4)
    assert _limits("max_background=64") == (64, 48)
    assert _limits("max_background=64,congestion_threshold=10") == (64, 10)
    assert _limits("max_background=0") == (0, 0)  # both left to the kernel
    assert _limits("max_background=0,congestion_threshold=5") == (0, 5)
    assert _limits("congestion_threshold=0") == (auto, 0)
    assert _limits("max_background=1") == (1, 1)


@pytest.mark.parametrize("bad", ["-1", "65536", "x"])
def test_limits_are_validated(bad):
    with pytest.raises(ConfigError, match="--max-background"):
        _limits(f"max_background={bad}")


@pytest.fixture
def fake_connection(tmp_path, monkeypatch):
    """A fake fusectl root holding connection 39, for mountpoint /mnt/x (device 0:39)."""
    root = tmp_path / "connections"
    (root / "39").mkdir(parents=True)
    (root / "39" / "max_background").write_text("12\n")
    (root / "39" / "congestion_threshold").write_text("9\n")
    monkeypatch.setattr(daemon, "_bdi_of", lambda mountpoint: "0:39" if mountpoint == "/mnt/x" else None)
    monkeypatch.setattr(daemon, "ensure_fusectl", lambda root: None)
    return root / "39"


def test_set_fuse_limits_writes_both_knobs_and_logs_once(fake_connection, caplog):
    with caplog.at_level(logging.INFO, logger="rapidmount"):
        daemon.set_fuse_limits("/mnt/x", 192, 144, root=str(fake_connection.parent))
    assert (fake_connection / "max_background").read_text() == "192"
    assert (fake_connection / "congestion_threshold").read_text() == "144"
    assert [r.getMessage() for r in caplog.records] == [
        "FUSE max_background 192, congestion_threshold 144 for /mnt/x (fusectl connection 39)"]


def test_set_fuse_limits_zero_leaves_a_knob(fake_connection, caplog):
    with caplog.at_level(logging.INFO, logger="rapidmount"):
        daemon.set_fuse_limits("/mnt/x", 0, 5, root=str(fake_connection.parent))
    assert (fake_connection / "max_background").read_text() == "12\n"
    assert (fake_connection / "congestion_threshold").read_text() == "5"
    assert "max_background 12, congestion_threshold 5" in caplog.text


def test_set_fuse_limits_without_fusectl_logs_one_info_line(fake_connection, monkeypatch, caplog):
    monkeypatch.setattr(daemon, "ensure_fusectl", lambda root: "mount: only root can use \"--types\" option")
    with caplog.at_level(logging.DEBUG, logger="rapidmount"):
        daemon.set_fuse_limits("/mnt/x", 64, 48, root=str(fake_connection.parent))
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "could not mount fusectl" in caplog.text and "only root" in caplog.text
    assert (fake_connection / "max_background").read_text() == "12\n"


def test_set_fuse_limits_refused_write_logs_one_info_line(fake_connection, caplog):
    (fake_connection / "max_background").unlink()
    (fake_connection / "max_background").mkdir()  # open(..., "w") fails: EISDIR
    with caplog.at_level(logging.DEBUG, logger="rapidmount"):
        daemon.set_fuse_limits("/mnt/x", 64, 48, root=str(fake_connection.parent))
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "could not set FUSE max_background to 64 for /mnt/x" in caplog.text


def test_set_fuse_limits_does_nothing_for_an_unknown_mount(fake_connection, monkeypatch):
    monkeypatch.setattr(daemon, "ensure_fusectl", lambda root: pytest.fail("must not mount fusectl"))
    daemon.set_fuse_limits("/mnt/elsewhere", 64, 48, root=str(fake_connection.parent))
    daemon.set_fuse_limits("/mnt/x", 0, 0, root=str(fake_connection.parent))


def test_ensure_fusectl_on_a_missing_directory(tmp_path):
    assert "does not exist" in daemon.ensure_fusectl(str(tmp_path / "absent"))


def test_ensure_fusectl_leaves_a_mount_point_alone(monkeypatch):
    monkeypatch.setattr(daemon.subprocess, "run", lambda *a, **k: pytest.fail("must not run mount"))
    assert daemon.ensure_fusectl("/proc") is None
    assert os.path.ismount("/proc")
