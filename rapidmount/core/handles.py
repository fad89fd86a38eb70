"""Open file and directory handles, and the table that numbers them."""

from __future__ import annotations

import errno
import itertools
from dataclasses import dataclass, field

from rapidmount.core.errors import FSError
from rapidmount.readahead.fetcher import FetchOwner
from rapidmount.readahead.policy import ReadaheadPolicy, StoreTally
from rapidmount.storage.seam import ObjectReader
from rapidmount.superblock.inodes import Inode
from rapidmount.superblock.names import ListedEntry


@dataclass
class OpenFile:
    """One open file handle: the generation it pinned, its reader and readahead state."""

    fh: int
    inode: Inode
    generation: int
    size: int
    finalized: bool
    direct_io: bool
    policy: ReadaheadPolicy
    reader: ObjectReader
    owner: FetchOwner = field(default_factory=FetchOwner)
    writable: bool = False
    append_only: bool = False
    whole: bool = False  # the whole object was requested at open: reads come from the cache
    stores: StoreTally = field(default_factory=StoreTally)  # do its page-cache stores beat its READs
    #: the size the kernel was told (at open, or by this mount's writes):
    #: page-cache stores stay below it; ``size`` may come from a listing
    kernel_size: int = field(init=False)
    reads: int = 0  # reads in flight (through the read path's chain)
    #: fetches and streams of generations the handle left, closed once unused
    retired: list[tuple[FetchOwner, ObjectReader]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kernel_size = self.size


@dataclass
class OpenDir:
    fh: int
    inode: Inode
    entries: list[ListedEntry] | None = None


class HandleTable:
    """Handles by number; numbers are never reused."""

    def __init__(self) -> None:
        self._handles: dict[int, OpenFile | OpenDir] = {}
        self._ids = itertools.count(1)

    def next_fh(self) -> int:
        return next(self._ids)

    def add(self, handle: OpenFile | OpenDir) -> None:
        self._handles[handle.fh] = handle

    def get(self, fh: int) -> OpenFile | OpenDir | None:
        return self._handles.get(fh)

    def pop(self, fh: int) -> OpenFile | OpenDir | None:
        return self._handles.pop(fh, None)

    def file(self, fh: int) -> OpenFile:
        handle = self._handles.get(fh)
        if not isinstance(handle, OpenFile):
            raise FSError(errno.EBADF)
        return handle

    def directory(self, fh: int) -> OpenDir:
        handle = self._handles.get(fh)
        if not isinstance(handle, OpenDir):
            raise FSError(errno.EBADF)
        return handle

    def files_of(self, ino: int) -> list[OpenFile]:
        return [h for h in list(self._handles.values()) if isinstance(h, OpenFile) and h.inode.ino == ino]

    def snapshot(self) -> list[OpenFile | OpenDir]:
        """A copy safe to take from another thread (the metrics endpoint)."""
        return list(self._handles.values())

