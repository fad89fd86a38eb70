"""Open file and directory handles, and the table that numbers them."""

from __future__ import annotations

import enum
import errno
import itertools
import os
from dataclasses import dataclass, field

from rapidmount.core.errors import FSError
from rapidmount.localcache.cache import LocalFile
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
    #: its generation's copy in the local cache (--cache-dir), read instead of the bucket
    local: LocalFile | None = None
    #: the kernel reads ``local`` itself (FUSE passthrough) through this backing id: no READ comes
    backing_id: int | None = None

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


class IoMode(enum.Enum):
    """How the kernel reads and writes one open."""

    CACHED = "cached"  # through the kernel's page cache
    DIRECT = "direct"  # FOPEN_DIRECT_IO: every read and write reaches the mount
    PASSTHROUGH = "passthrough"  # FOPEN_PASSTHROUGH: the kernel reads a local file itself


class CacheModes:
    """How each open reaches the file; no I/O.

    ``O_DIRECT`` asks for it. A write-only open gets it too while no open of
    its file uses the page cache: through the cache, the kernel copies every
    WRITE into page-cache pages first, which nobody reads (the next open
    drops them) and which cost the writer a fresh page per 4 KiB. While such a
    writer is open, every other open of its file bypasses the cache as well,
    so no reader can cache a page the writer is changing. An ``O_DIRECT``
    writer leaves the other opens as they are, as the kernel always has.

    A read-only open of a file whose whole generation is in the local cache
    may be a passthrough open: the kernel reads the cache's file itself. The
    kernel refuses (EIO at ``open()``) a passthrough open of an inode that
    has opens through the page cache, and one through the page cache while
    it has passthrough opens; direct opens go with either. So while a
    passthrough open is open, other opens of its file are direct.

    A writer stops counting at the close of one of its descriptors (FLUSH):
    the kernel sends its RELEASE later, in the background, and an open that
    comes meanwhile (``np.save``, then ``np.load(mmap_mode="r")``) must not
    be made direct, or its shared ``mmap`` fails. If the handle writes again
    (through another descriptor), it counts again from that WRITE.

    The first column that holds decides:

    | the open | ``O_DIRECT`` | a writer made direct here is open (and wrote since its last FLUSH) | a passthrough open is open | another open uses the cache | else |
    |---|---|---|---|---|---|
    | write-only | direct | direct | direct | cached | direct |
    | read-only, its whole generation in the local cache | direct | direct | passthrough | cached | passthrough |
    | read-only or read-write | direct | direct | direct | cached | cached |
    """

    def __init__(self, direct_writes: bool = True) -> None:
        self.direct_writes = direct_writes
        self._cached: dict[int, int] = {}  # ino -> open handles that use the page cache
        self._writers: dict[int, int] = {}  # ino -> writable handles made direct here
        self._passthrough: dict[int, int] = {}  # ino -> passthrough opens
        self._counted: dict[int, tuple[dict[int, int], int]] = {}  # fh -> (the count it is in, ino)
        self._flushed: dict[int, int] = {}  # fh -> ino: writers made direct here, not counted since a FLUSH

    def open(self, fh: int, ino: int, flags: int) -> bool:
        """Whether handle ``fh``, an open of ``ino`` with ``flags``, bypasses the
        page cache; it counts for the next opens of ``ino`` until :meth:`closed`."""
        return self.mode(fh, ino, flags) is IoMode.DIRECT

    def mode(self, fh: int, ino: int, flags: int, *, local_copy: bool = False) -> IoMode:
        """How handle ``fh``, an open of ``ino`` with ``flags``, reaches it
        (``local_copy``: its whole generation is in the local cache, and the
        kernel may read it there); it counts for the next opens of ``ino``
        until :meth:`closed`."""
        if flags & os.O_DIRECT:
            return IoMode.DIRECT
        access = flags & os.O_ACCMODE
        write_only = access == os.O_WRONLY
        if (self._writers.get(ino) or self._passthrough.get(ino) and not (local_copy and access == os.O_RDONLY)
                or (self.direct_writes and write_only and not self._cached.get(ino))):
            if access != os.O_RDONLY:
                self._count(self._writers, fh, ino)
            return IoMode.DIRECT
        if local_copy and access == os.O_RDONLY and not self._cached.get(ino):
            self._count(self._passthrough, fh, ino)
            return IoMode.PASSTHROUGH
        self._count(self._cached, fh, ino)
        return IoMode.CACHED

    def refused(self, fh: int) -> IoMode:
        """The kernel would not take handle ``fh``'s passthrough open: it is
        direct while other passthrough opens of its file are open, else cached."""
        counted = self._counted.get(fh)
        assert counted is not None and counted[0] is self._passthrough
        ino = counted[1]
        self.closed(fh)
        if self._passthrough.get(ino):
            return IoMode.DIRECT
        self._count(self._cached, fh, ino)
        return IoMode.CACHED

    def flushed(self, fh: int) -> None:
        """A descriptor of handle ``fh`` was closed."""
        counted = self._counted.get(fh)
        if counted is not None and counted[0] is self._writers:
            self.closed(fh)
            self._flushed[fh] = counted[1]

    def wrote(self, fh: int) -> None:
        """A WRITE of handle ``fh``: a writer not counted since a FLUSH counts again."""
        ino = self._flushed.pop(fh, None)
        if ino is not None:
            self._count(self._writers, fh, ino)

    def closed(self, fh: int) -> None:
        self._flushed.pop(fh, None)
        counted = self._counted.pop(fh, None)
        if counted is not None:
            counts, ino = counted
            counts[ino] -= 1
            if not counts[ino]:
                del counts[ino]

    def _count(self, counts: dict[int, int], fh: int, ino: int) -> None:
        counts[ino] = counts.get(ino, 0) + 1
        self._counted[fh] = (counts, ino)
