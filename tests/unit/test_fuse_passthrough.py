"""Backing files for FUSE passthrough: one registration per inode, as the kernel requires."""

from __future__ import annotations

import errno
import fcntl
import struct

import pytest

from rapidmount.shared import fuse_abi as abi
from rapidmount.fuse.passthrough import DeviceBackingFiles


class Device:
    """The ioctls a FUSE device would take, recorded."""

    def __init__(self, refuse: int | None = None) -> None:
        self.refuse = refuse
        self.open_ids: dict[int, int] = {}  # backing id -> the fd registered
        self.calls: list[tuple[str, int]] = []
        self.next_id = 1

    def ioctl(self, fd: int, request: int, argument: bytearray, mutate: bool) -> int:
        assert fd == 99 and mutate
        if request == abi.FUSE_DEV_IOC_BACKING_OPEN:
            backing_fd, flags = abi.BACKING_MAP.unpack(bytes(argument))
            assert flags == 0
            if self.refuse is not None:
                raise OSError(self.refuse, "refused")
            self.open_ids[self.next_id] = backing_fd
            self.calls.append(("open", backing_fd))
            self.next_id += 1
            return self.next_id - 1
        assert request == abi.FUSE_DEV_IOC_BACKING_CLOSE
        (backing_id,) = struct.unpack("<I", bytes(argument))
        del self.open_ids[backing_id]
        self.calls.append(("close", backing_id))
        return 0


@pytest.fixture
def device(monkeypatch):
    fake = Device()
    monkeypatch.setattr(fcntl, "ioctl", fake.ioctl)
    return fake


def test_opens_of_one_inode_share_one_registration_closed_at_the_last(device):
    files = DeviceBackingFiles(99)
    assert files.open(5, 10, (1, 100)) == 1
    assert files.open(5, 11, (1, 100)) == 1, "the same file: the same id"
    assert files.open(6, 12, (1, 200)) == 2
    files.close(5)
    assert device.open_ids == {1: 10, 2: 12}
    files.close(5)
    files.close(6)
    assert device.open_ids == {} and files.registered == 0
    assert device.calls == [("open", 10), ("open", 12), ("close", 1), ("close", 2)]


def test_another_file_for_an_inode_with_passthrough_opens_is_refused(device):
    files = DeviceBackingFiles(99)
    assert files.open(5, 10, (1, 100)) == 1
    assert files.open(5, 11, (1, 101)) is None, "the kernel would fail that open with EIO"
    files.close(5)
    assert files.open(5, 11, (1, 101)) == 2


@pytest.mark.parametrize("code, why", [(errno.EPERM, "CAP_SYS_ADMIN"), (errno.ELOOP, "overlayfs")])
def test_a_refusal_is_logged_once_and_ends_passthrough(monkeypatch, caplog, code, why):
    fake = Device(refuse=code)
    monkeypatch.setattr(fcntl, "ioctl", fake.ioctl)
    files = DeviceBackingFiles(99)
    assert files.open(5, 10, (1, 100)) is None
    assert files.open(6, 11, (1, 101)) is None
    assert len(caplog.records) == 1 and fake.calls == []
    assert why in caplog.records[0].getMessage() and files.refused is not None
