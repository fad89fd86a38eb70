"""Backing files for FUSE passthrough: the kernel reads a local file itself.

The kernel takes a file for passthrough once it is registered on the FUSE
device (``FUSE_DEV_IOC_BACKING_OPEN``, which needs ``CAP_SYS_ADMIN``); an
OPEN reply then names it by its backing id with ``FOPEN_PASSTHROUGH``. All
passthrough opens of one inode must name the same registration, so one is
kept per inode while any of its passthrough opens is open, and closed
(``FUSE_DEV_IOC_BACKING_CLOSE``) at the last release. Opens of a file that
the kernel already holds keep it after the close.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import struct
from dataclasses import dataclass

from rapidmount.shared import fuse_abi as abi

__all__ = ["DeviceBackingFiles"]

log = logging.getLogger("rapidmount.fuse")

_BACKING_ID = struct.Struct("<I")
_WHY = {errno.EPERM: ": the daemon lacks CAP_SYS_ADMIN",
        errno.ELOOP: ": --cache-dir is on a stacked file system, such as a container's overlayfs"}


@dataclass(slots=True)
class _Registration:
    identity: tuple[int, int]
    backing_id: int
    opens: int


class DeviceBackingFiles:
    """Registrations on one FUSE device descriptor, one per inode."""

    def __init__(self, device_fd: int) -> None:
        self.device_fd = device_fd
        self._by_ino: dict[int, _Registration] = {}
        #: why the kernel refuses backing files on this connection, once it did
        self.refused: str | None = None

    def open(self, ino: int, fd: int, identity: tuple[int, int]) -> int | None:
        held = self._by_ino.get(ino)
        if held is not None:
            if held.identity != identity:
                return None  # another generation's file backs the inode's open passthrough handles
            held.opens += 1
            return held.backing_id
        if self.refused is not None:
            return None
        argument = bytearray(abi.BACKING_MAP.pack(fd, 0))
        try:
            backing_id = int(fcntl.ioctl(self.device_fd, abi.FUSE_DEV_IOC_BACKING_OPEN, argument, True))
        except OSError as err:
            self.refused = f"{err.strerror or err}{_WHY.get(err.errno or 0, '')}"
            log.warning("FUSE passthrough: the kernel refuses backing files (%s); the mount serves the local "
                        "cache's reads itself", self.refused)
            return None
        self._by_ino[ino] = _Registration(identity, backing_id, 1)
        return backing_id

    def close(self, ino: int) -> None:
        held = self._by_ino.get(ino)
        if held is None:
            return
        held.opens -= 1
        if held.opens:
            return
        del self._by_ino[ino]
        try:
            fcntl.ioctl(self.device_fd, abi.FUSE_DEV_IOC_BACKING_CLOSE, bytearray(_BACKING_ID.pack(held.backing_id)),
                        True)
        except OSError as err:  # the connection is going away: the kernel drops them all
            log.debug("FUSE passthrough: closing backing id %d: %s", held.backing_id, err)

    @property
    def registered(self) -> int:
        return len(self._by_ino)
