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
