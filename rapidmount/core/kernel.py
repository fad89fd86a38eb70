"""What the core tells the kernel to forget after this mount changed something.

The kernel caches directory entries and attributes for ``--metadata-ttl``;
after an unlink, rename, upload or a refused change, the core drops its own
caches and asks the kernel to drop its copies too, so the mount sees its
own changes at once. ``rapidmount.fuse.invalidate`` implements this; the
core tests use :class:`RecordingKernel`.
"""

from __future__ import annotations

from typing import Protocol


class KernelCache(Protocol):
    def forget_entry(self, parent_ino: int, name: str) -> None:
        """Drop the kernel's cached entry ``name`` in directory ``parent_ino``."""

    def forget_attributes(self, ino: int) -> None:
        """Drop the kernel's cached attributes and pages of ``ino``."""


class BackingFiles(Protocol):
    """Local files the kernel reads itself for passthrough opens (FUSE
    passthrough), one per inode at a time, as the kernel requires."""

    def open(self, ino: int, fd: int, identity: tuple[int, int]) -> int | None:
        """The backing id of file ``fd`` (``identity``: its device and inode)
        for a passthrough open of ``ino``; None if the kernel would not take it
        (another file backs ``ino`` now, or the kernel refuses backing files)."""

    def close(self, ino: int) -> None:
        """A passthrough open of ``ino`` was released."""


class RecordingKernel:
    """A kernel that remembers what it was told (core tests, and no mount yet)."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, str]] = []
        self.attributes: list[int] = []

    def forget_entry(self, parent_ino: int, name: str) -> None:
        if len(self.entries) < 10_000:
            self.entries.append((parent_ino, name))

    def forget_attributes(self, ino: int) -> None:
        if len(self.attributes) < 10_000:
            self.attributes.append(ino)
