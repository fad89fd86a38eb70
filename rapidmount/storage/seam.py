"""The storage seam: every storage call the filesystem core makes, in trio.

The core holds one :class:`ObjectStore` and nothing else of storage. Two
implementations stand behind it:

* ``rapidmount.dataplane.store.WorkerStore``: Storage v2 over gRPC, the
  calls made by data-plane worker processes, the bytes in shared memory;
* ``rapidmount.emulator.memory_store.MemoryStore``: an in-memory bucket with the
  emulator's semantics and hooks to inject failures, for the core tests.

Every method raises :class:`rapidmount.storage.errors.StorageError` (with
its errno) when it fails for good; retries inside the deadline are the
implementation's business. What a bucket can do is asked of
``store.layout`` (:class:`rapidmount.storage.model.BucketLayout`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rapidmount.storage.counters import RpcErrorCounts, StreamEvents
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import BucketLayout, DirectoryMeta, FolderMeta, ListPage, ObjectMeta
from rapidmount.shared.views import Arriving

__all__ = ["Answer", "KernelOnly", "ObjectAppender", "ObjectReader", "ObjectStore", "PageStore", "UploadSource", "COMPOSE_MAX_SOURCES", "COMPOSE_PREFIX", "LIST_PAGE_SIZE"]

LIST_PAGE_SIZE = 1000
COMPOSE_MAX_SOURCES = 32  # the service's limit per ComposeObject
COMPOSE_PREFIX = ".rapidmount-compose/"  # temporary composites live under this prefix

#: The bytes of an upload: an open file descriptor of this process (a staged
#: file), read with ``pread``, or None for an empty object. The caller keeps
#: it open for the call; a store whose calls run in other processes passes
#: them the descriptor itself, never its number or a path.
UploadSource = int | None


@dataclass(frozen=True, slots=True)
class PageStore:
    """Where the bytes ``[start, end)`` of a read also go: the kernel's page
    cache of inode ``ino``. Refused once the inode's epoch is past ``epoch``;
    ``ticket`` names it for :meth:`ObjectStore.skip_page_store`."""

    ino: int
    epoch: int
    start: int
    end: int
    ticket: int = 0


class Answer(Protocol):
    """A request that the bytes ``[skip, skip + length)`` of one read also
    answer (``length`` None: all of them from ``skip``), where they land.
    Opaque to the core and the seam: the FUSE layer makes it, and a store that
    can answer it there (a data-plane worker holds the mount's device) does,
    and sets ``sent``: the reader then has its bytes without waiting."""

    skip: int
    length: int | None
    sent: bool


class KernelOnly:
    """A block read ahead whose bytes went only to the kernel's page cache
    (its ``pages`` covered all of it): none is held here. The reader reads
    them there. A READ that comes for them anyway (it arrived before their
    store was made, or the kernel dropped the pages) asks :meth:`copy`."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    async def copy(self, reply: Answer | None = None) -> bytes | memoryview | KernelOnly | None:
        """The bytes, while their store still holds them; None after: read them
        again. ``reply``: the READ they are for, which may be answered from them
        where they are held (then ``reply.sent``, and the answer may be this
        block itself: the bytes stay where they are held, not copied)."""
        return None


@runtime_checkable
class ObjectReader(Protocol):
    """Ranges of one object generation, for one open file handle.

    On a bucket with bidi reads this is one long-lived stream, opened at the
    first read; concurrent reads share it.
    """

    @property
    def stream_open(self) -> bool:
        """A stream is open now (for metrics)."""

    async def read(self, offset: int, length: int, *, pages: PageStore | None = None,
                   reply: Answer | None = None) -> bytes | memoryview:
        """``length`` bytes at ``offset``, fewer at the object's end; CRC32C checked.

        A pinned generation that no longer exists fails with ESTALE. With
        ``pages`` (only if the store ``stores_pages``), the bytes are also
        stored into the kernel's page cache, after this read has answered.
        With ``reply``, the store may also answer that READ with the bytes
        (see :class:`Answer`); the bytes are returned all the same.
        """

    async def read_blocks(self, offset: int, lengths: list[int],
                          pages: list[PageStore | None]) -> list[bytes | memoryview | KernelOnly]:
        """Consecutive ranges from ``offset``, of ``lengths``, as :meth:`read`
        gives each (``pages[i]`` for range ``i``), answered together: one call
        for several blocks read ahead. Fails as a whole if any range fails.
        A range whose ``pages`` cover all of it may come as :class:`KernelOnly`."""

    async def close(self) -> None:
        """Drop the stream; never raises."""


@runtime_checkable
class ObjectAppender(Protocol):
    """Appends to one appendable object over one stream (buckets with
    ``layout.appendable_objects``). Bytes not yet confirmed persisted are kept
    and resent after a break; another writer taking over fails with ESTALE."""

    generation: int

    @property
    def stream_open(self) -> bool:
        """A stream is open now (for metrics)."""

    async def create(self, *, if_generation_match: int | None = 0,
                     metadata: Mapping[str, str] | None = None) -> ObjectMeta | None:
        """A new appendable object (``0``: the name must be free, else ESTALE)."""

    async def takeover(self, generation: int) -> int:
        """Become the writer of unfinalized ``generation``; returns its persisted size."""

    def append_now(self, data: bytes | memoryview | Arriving) -> bool:
        """Queue ``data`` as ``append`` would, at once, if that needs no wait;
        False (nothing done) when it does: then ``append`` it."""

    async def append(self, data: bytes | memoryview | Arriving) -> None:
        """Queue ``data`` at the end; waits while the unconfirmed buffer is full.
        Bytes still arriving (a WRITE's, in a pipe) are landed by a store
        that cannot take them as they are (:func:`~rapidmount.shared.views.landed`)."""

    async def append_file(self, source: int, size: int) -> None:
        """Append the first ``size`` bytes of the open file ``source`` (a staged
        file), read by the store where its stream lives, not by the caller.
        Returns once they are queued as ``append`` does; the store keeps what
        it needs of ``source`` (a duplicate) until they are confirmed, so the
        caller may close it at once, but must not change those bytes before
        the next ``flush``, ``finalize`` or ``close`` returns."""

    async def flush(self) -> int:
        """Every byte appended so far durable (CRC32C confirmed); the persisted size."""

    async def finalize(self) -> ObjectMeta:
        """Persist everything and finalize the object with its full CRC32C."""

    async def close(self) -> None:
        """Persist everything and end the stream; the object stays appendable."""

    async def abort(self) -> None:
        """End the stream, persisting nothing more; never raises."""


@runtime_checkable
class ObjectStore(Protocol):
    """One bucket, as the filesystem core sees it (trio-facing)."""

    bucket: str
    layout: BucketLayout
    stream_events: StreamEvents
    rpc_errors: RpcErrorCounts
    #: Reads can also store their bytes into the kernel's page cache (``PageStore``).
    stores_pages: bool

    # -- metadata ---------------------------------------------------------------------------------

    async def get_object(self, name: str, generation: int = 0) -> ObjectMeta | None:
        """The object's metadata (its live generation, or ``generation``), None if absent."""

    async def stat_name(self, name: str) -> tuple[ObjectMeta | None, DirectoryMeta | None]:
        """``name`` as a file and as a directory, in one round trip (two for a
        directory on a bucket with folders: its placeholder is asked for once
        its folder is found): (the object or None, directory ``name/`` with its
        folder and placeholder, or None if there is no such directory)."""

    async def list_page(self, prefix: str, *, delimiter: str = "/", page_token: str = "",
                        page_size: int = LIST_PAGE_SIZE, start: str = "", end: str = "",
                        include_trailing_delimiter: bool = False) -> ListPage:
        """One page of objects and sub-prefixes below ``prefix``; on buckets with
        folders, empty folders are listed as prefixes too."""

    async def list_folders_page(self, prefix: str, *, page_token: str = "", page_size: int = LIST_PAGE_SIZE,
                                start: str = "", end: str = "") -> tuple[list[FolderMeta], str]:
        """One page of every folder below ``prefix`` (buckets with folders):
        (the folders, such as ``"a/b/"``, next page token)."""

    async def list_directory(self, prefix: str, *, delimiter: str = "/",
                             limit: int | None = None) -> tuple[list[ObjectMeta], list[str], bool]:
        """Every page of ``list_page``: (objects, prefixes, complete); ``complete``
        is False when ``limit`` entries were reached first. With delimiter
        ``/``, the placeholder objects of subdirectories (``prefix + "x/"``)
        come as objects too (``include_trailing_delimiter``)."""

    async def list_child_folders(self, prefix: str) -> list[FolderMeta]:
        """Every folder directly below ``prefix`` (buckets with folders), all pages."""

    # -- changes ----------------------------------------------------------------------------------

    async def write_object(self, name: str, source: UploadSource, size: int, *, if_generation_match: int | None,
                           metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        """Upload a whole new generation (``0``: the name must be free); a failed
        precondition is ESTALE."""

    async def delete_object(self, name: str, *, if_generation_match: int | None = None) -> None:
        """Delete the object; a failed precondition is ESTALE, a missing one ENOENT."""

    async def move_object(self, source: str, destination: str, *,
                          if_source_generation_match: int | None = None,
                          if_generation_match: int | None = None) -> ObjectMeta:
        """Rename one object atomically; returns the destination's metadata."""

    async def update_metadata(self, name: str, generation: int, metadata: Mapping[str, str], *,
                              if_metageneration_match: int | None = None) -> ObjectMeta:
        """Set custom metadata keys of ``generation`` (which must still be live)."""

    async def create_folder(self, prefix: str) -> FolderMeta | None:
        """A folder (buckets with folders); None when the service's record of
        it is not at hand (the call was made again after its worker died)."""

    async def delete_folder(self, prefix: str) -> None:
        """Delete an empty folder (buckets with folders)."""

    async def rename_folder(self, source: str, destination: str) -> FolderMeta | None:
        """Rename a folder and everything below it atomically (buckets with
        folders); the renamed folder, when the service's answer names it."""

    # -- data -------------------------------------------------------------------------------------

    async def drain_page_stores(self, ino: int, epoch: int) -> None:
        """From now on refuse page-cache stores of ``ino`` older than
        ``epoch``, and return once none of them can still land."""

    def skip_page_store(self, ticket: int) -> None:
        """Do not make that store if it is not made yet: a READ of its pages
        reached the mount first, and waits for these bytes."""

    def open_reader(self, name: str, generation: int) -> ObjectReader:
        """A reader of ``generation``; no round trip until its first read."""

    def open_appender(self, name: str) -> ObjectAppender:
        """An appender for ``name``; no round trip until create or takeover."""

    async def read_objects_whole(self, items: list[tuple[str, int, int]], *,
                                 concurrency: int) -> list[bytes | memoryview | StorageError]:
        """The first ``length`` bytes of each ``(name, generation, length)``,
        concurrently; failures come back as values, in order."""

    async def read_objects_composed(self, items: list[tuple[str, int, int, int | None]], *, concurrency: int,
                                    temporary_name: Callable[[], str]
                                    ) -> list[bytes | memoryview | StorageError]:
        """Whole small objects ``(name, generation, size, crc32c)`` read through
        temporary composites (buckets with compose); failures come back as values."""
