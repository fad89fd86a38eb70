"""An in-memory bucket behind the storage seam, for core tests without FUSE or gRPC.

:class:`MemoryStore` is an :class:`~rapidmount.storage.seam.ObjectStore` over
the emulator's bucket model (:class:`rapidmount.emulator.store.Store`, in
memory): objects, generations, preconditions, folders, listings, compose and
appendable objects are the emulator's own. What this module adds is what
lies between the seam and the service on the gRPC path: the request each
seam call makes, records turned into ``ObjectMeta`` through the wire
``Object`` as the client turns them (``record_from_object``), refusals
turned into ``StorageError``s, read streams and the appender's buffer. Every
call awaits one trio checkpoint, then runs to completion: each call is
atomic, as one RPC is.

Test hooks (synchronous; only ``fail_next`` and ``hold`` affect the seam's calls):

* ``store.fail_next(method, code, times=1, match=None)``: the next ``times``
  calls of ``method`` (whose object name satisfies ``match``, if given) raise
  ``StorageError`` with ``code`` and do nothing else. ``method`` is a store
  method (``"write_object"``, ``"list_page"``, ...) or ``"reader.read"``,
  ``"appender.create"``, ``.takeover``, ``.append``, ``.append_file``,
  ``.flush``, ``.finalize``, ``.close``. In ``read_objects_whole`` a fault fails one item (returned as a
  value); in ``read_objects_composed`` one group's compose (matched against
  its sources), which falls back to whole reads. ``store.clear_faults()``.
* ``store.hold(method)``: calls of ``method`` wait until the returned event is set.
* ``store.calls``: a ``Counter`` of calls by those names, failed ones included.
* ``store.put(name, data=b"", *, appendable=False, finalize=None, metadata=None)``:
  another client writes a new generation; appendable ones stay unfinalized
  unless ``finalize=True`` (zonal buckets only).
* ``store.append_external(name, data)``, ``store.finalize_external(name)``:
  another client takes the unfinalized object over (fencing our appenders)
  and appends to it / finalizes it.
* ``store.delete_external(name)``; ``store.data(name)`` (the persisted bytes),
  ``store.meta(name)``, ``store.names()``, ``store.folder_names()``.

Deliberately unlike the gRPC path: nothing is retried or redirected and no
checksum fails; an appender persists whole 2 MiB chunks at ``append`` (as the
client's background sender) and the rest at flush/close/finalize, and every
append checks that it is still the writer. NOT_FOUND on a call naming a
generation (reads, appends, ``update_metadata``) is ESTALE.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from rapidmount.shared import wire
from rapidmount.workers.client.storage import is_child_folder, record_from_folder, record_from_object
from rapidmount.emulator import store as emu
from rapidmount.emulator.blobs import BlobReader
from rapidmount.emulator.convert import folder_proto
from rapidmount.emulator.resources import object_message
from rapidmount.shared.views import Arriving, landed
from rapidmount.storage.counters import RpcErrorCounts, StreamEvents
from rapidmount.storage.errors import StorageCode, StorageError, errno_for
from rapidmount.storage.model import BucketLayout, DirectoryMeta, FolderMeta, ListPage, ObjectMeta
from rapidmount.storage.seam import COMPOSE_MAX_SOURCES, LIST_PAGE_SIZE, Answer, PageStore, UploadSource

__all__ = ["CHUNK", "MemoryStore"]

CHUNK = wire.MAX_CHUNK_BYTES  # what the client's appender sends as one message

# Seam method -> the RPC it stands for, under which rpc_errors counts its failures ("" = the read RPC).
_RPC_OF = {
    "get_object": "GetObject", "stat_name": "GetObject", "list_page": "ListObjects",
    "list_directory": "ListObjects", "list_folders_page": "ListFolders", "list_child_folders": "ListFolders",
    "write_object": "WriteObject",
    "delete_object": "DeleteObject", "move_object": "MoveObject", "update_metadata": "UpdateObject",
    "create_folder": "CreateFolder", "delete_folder": "DeleteFolder", "rename_folder": "RenameFolder",
    "read_objects_whole": "", "read_objects_composed": "ComposeObject", "reader.read": "",
    **{f"appender.{op}": "BidiWriteObject"
       for op in ("create", "takeover", "append", "append_file", "flush", "finalize", "close")},
}


def _read_source(source: UploadSource, size: int) -> bytes:
    """The first ``size`` bytes of an upload's source (fewer if the file is shorter)."""
    if source is None:
        return b""
    return b"".join(os.pread(source, min(CHUNK, size - offset), offset) for offset in range(0, size, CHUNK))


@dataclass
class _Fault:
    method: str
    code: StorageCode
    times: int
    match: Callable[[str], bool] | None


def _meta(record: emu.ObjectRecord) -> ObjectMeta:
    """What the client makes of the ``Object`` the service sends for ``record``."""
    return record_from_object(object_message(record))


def _folder(record: emu.FolderRecord) -> FolderMeta:
    """What the client makes of the ``Folder`` the service sends for ``record``."""
    return record_from_folder(folder_proto(record), record.name)


def _every(page: Callable[[str], tuple[list[str], str]]) -> list[str]:
    """The names of every page ``page(token)`` returns, following the tokens."""
    names, token = [], ""
    while True:
        listed, token = page(token)
        names += listed
        if not token:
            return names


class MemoryStore:
    """One in-memory bucket: ``MemoryStore(bucket="memory-bucket", kind="zonal" | "hns" | "flat")``."""

    def __init__(self, bucket: str = "memory-bucket", kind: str = "zonal") -> None:
        self.model = emu.Store()
        created = self.model.create_bucket(bucket, kind)
        self.bucket, self.kind = bucket, kind
        self.layout = BucketLayout(name=bucket, location=emu.REGION, location_type=created.location_type,
                                   hierarchical_namespace=created.hierarchical)
        self.stream_events = StreamEvents()
        self.rpc_errors = RpcErrorCounts()
        self.stores_pages = False  # no kernel behind it
        self.calls: Counter[str] = Counter()
        self._faults: list[_Fault] = []
        self._holds: dict[str, trio.Event] = {}

    # -- test hooks -------------------------------------------------------------------------------

    def fail_next(self, method: str, code: StorageCode, times: int = 1,
                  match: Callable[[str], bool] | None = None) -> None:
        if method not in _RPC_OF:
            raise ValueError(f"unknown method {method!r}; one of {', '.join(sorted(_RPC_OF))}")
        self._faults.append(_Fault(method, code, times, match))

    def hold(self, method: str) -> trio.Event:
        """Calls of ``method`` wait until the returned event is set (to order races in tests)."""
        event = self._holds[method] = trio.Event()
        return event

    def clear_faults(self) -> None:
        self._faults.clear()

    def put(self, name: str, data: bytes = b"", *, appendable: bool = False, finalize: bool | None = None,
            metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        finalized = not appendable if finalize is None else finalize
        if not finalized and not (appendable and self.layout.appendable_objects):
            raise ValueError("only appendable objects on a zonal bucket can stay unfinalized")
        return _meta(self.model.put_object(self.bucket, name, data, finalize=finalized, metadata=metadata))

    def append_external(self, name: str, data: bytes) -> ObjectMeta:
        record = self._take_over_externally(name)
        return _meta(self.model.append(self.bucket, name, record.generation, record.writer_epoch, record.size, data))

    def finalize_external(self, name: str) -> ObjectMeta:
        record = self._take_over_externally(name)
        return _meta(self.model.finalize(self.bucket, name, record.generation, record.writer_epoch))

    def _take_over_externally(self, name: str) -> emu.ObjectRecord:
        return self.model.open_appendable(self.bucket, name, self.model.get_object(self.bucket, name).generation)

    def delete_external(self, name: str) -> None:
        self.model.delete_object(self.bucket, name)

    def data(self, name: str) -> bytes:
        return self.model.read_all(self.bucket, name)

    def meta(self, name: str) -> ObjectMeta | None:
        record = self.model.find_object(self.bucket, name)
        return _meta(record) if record else None

    def names(self) -> list[str]:
        def page(token: str) -> tuple[list[str], str]:
            listing = self.model.list_objects(self.bucket, page_token=token)
            return [record.name for record in listing.objects], listing.next_page_token
        return _every(page)

    def folder_names(self) -> list[str]:
        if not self.layout.folders:
            return []

        def page(token: str) -> tuple[list[str], str]:
            listing = self.model.list_folders(self.bucket, page_token=token)
            return [folder.name for folder in listing.folders], listing.next_page_token
        return _every(page)

    # -- plumbing ---------------------------------------------------------------------------------

    def _take_fault(self, method: str, *names: str) -> None:
        for fault in self._faults:
            if fault.method == method and (fault.match is None or any(map(fault.match, names))):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                refusal = emu.StoreError(f"injected {fault.code.name}")
                refusal.code = fault.code.name
                raise refusal

    def _read_rpc(self) -> str:
        return "BidiReadObject" if self.layout.bidi_reads else "ReadObject"

    def _error(self, method: str, err: emu.StoreError, name: str | None, pinned: bool,
               rpc: str | None = None) -> StorageError:
        code = StorageCode[err.code]
        self.rpc_errors.add(rpc or _RPC_OF[method] or self._read_rpc(), code)
        return StorageError(f"{method} {name!r}: {code.name}: {err}", code=code, object_name=name,
                            errno_=errno_for(code, pinned_generation=pinned))

    @asynccontextmanager
    async def _call(self, method: str, name: str = "", *, pinned: bool = False) -> AsyncIterator[None]:
        """One call of the seam: counted, a checkpoint, a hold, an injected fault, refusals mapped."""
        self.calls[method] += 1
        await trio.lowlevel.checkpoint()
        held = self._holds.get(method)
        if held is not None:
            await held.wait()
        try:
            self._take_fault(method, name)
            yield
        except emu.StoreError as err:
            raise self._error(method, err, name, pinned) from None

    def _read_once(self, name: str, generation: int, offset: int, length: int) -> bytes:
        """One ReadObject call: the bytes there are of ``[offset, offset + length)``."""
        _, reader = self.model.open_reader(self.bucket, name, generation)
        try:
            return reader.read(offset, max(0, min(length, reader.size() - offset)))
        finally:
            reader.close()

    # -- metadata ---------------------------------------------------------------------------------

    async def get_object(self, name: str, generation: int = 0) -> ObjectMeta | None:
        async with self._call("get_object", name):
            try:
                return _meta(self.model.get_object(self.bucket, name, generation))
            except emu.NotFound:
                self.rpc_errors.add("GetObject", "NOT_FOUND")  # what the client sees before it returns None
                return None

    async def stat_name(self, name: str) -> tuple[ObjectMeta | None, DirectoryMeta | None]:
        async with self._call("stat_name", name):
            record, prefix = self.model.find_object(self.bucket, name), name + "/"
            found: DirectoryMeta | None = None
            if self.layout.folders:  # every object's parent folders exist: folders alone decide
                try:
                    folder = self.model.get_folder(self.bucket, prefix)
                except emu.NotFound:
                    pass
                else:
                    placeholder = self.model.find_object(self.bucket, prefix)
                    found = DirectoryMeta(prefix, _folder(folder), _meta(placeholder) if placeholder else None)
            else:
                probe = self.model.list_objects(self.bucket, prefix=prefix, delimiter="/", page_size=1,
                                                include_trailing_delimiter=True)
                if probe.objects or probe.prefixes:
                    placeholder = next((o for o in probe.objects if o.name == prefix), None)
                    found = DirectoryMeta(prefix, None, _meta(placeholder) if placeholder else None)
            return (_meta(record) if record else None), found

    def _list(self, prefix: str, delimiter: str = "/", page_token: str = "", page_size: int = LIST_PAGE_SIZE,
              start: str = "", end: str = "", include_trailing_delimiter: bool = False) -> ListPage:
        listing = self.model.list_objects(
            self.bucket, prefix=prefix, delimiter=delimiter, include_trailing_delimiter=include_trailing_delimiter,
            lexicographic_start=start, lexicographic_end=end, page_size=page_size, page_token=page_token,
            include_folders_as_prefixes=self.layout.folders and delimiter == "/")
        return ListPage([_meta(record) for record in listing.objects], listing.prefixes, listing.next_page_token)

    async def list_page(self, prefix: str, *, delimiter: str = "/", page_token: str = "",
                        page_size: int = LIST_PAGE_SIZE, start: str = "", end: str = "",
                        include_trailing_delimiter: bool = False) -> ListPage:
        async with self._call("list_page", prefix):
            return self._list(prefix, delimiter, page_token, page_size, start, end, include_trailing_delimiter)

    async def list_folders_page(self, prefix: str, *, page_token: str = "", page_size: int = LIST_PAGE_SIZE,
                                start: str = "", end: str = "") -> tuple[list[FolderMeta], str]:
        async with self._call("list_folders_page", prefix):
            listing = self.model.list_folders(self.bucket, prefix=prefix, lexicographic_start=start,
                                              lexicographic_end=end, page_size=page_size, page_token=page_token)
            return [_folder(folder) for folder in listing.folders], listing.next_page_token

    async def list_child_folders(self, prefix: str) -> list[FolderMeta]:
        children: list[FolderMeta] = []
        token = ""
        async with self._call("list_child_folders", prefix):
            while True:
                listing = self.model.list_folders(self.bucket, prefix=prefix, delimiter="/", page_token=token)
                children += (_folder(folder) for folder in listing.folders if is_child_folder(folder.name, prefix))
                token = listing.next_page_token
                if not token:
                    return children
                await trio.lowlevel.checkpoint()  # a round trip per page

    async def list_directory(self, prefix: str, *, delimiter: str = "/",
                             limit: int | None = None) -> tuple[list[ObjectMeta], list[str], bool]:
        objects: list[ObjectMeta] = []
        prefixes: list[str] = []
        token = ""
        async with self._call("list_directory", prefix):
            while True:
                page = self._list(prefix, delimiter, token, include_trailing_delimiter=delimiter == "/")
                objects += page.objects
                prefixes += page.prefixes
                token = page.next_page_token
                if not token:
                    return objects, prefixes, True
                if limit is not None and len(objects) + len(prefixes) >= limit:
                    return objects, prefixes, False
                await trio.lowlevel.checkpoint()  # a round trip per page

    # -- changes ----------------------------------------------------------------------------------

    async def write_object(self, name: str, source: UploadSource, size: int, *, if_generation_match: int | None,
                           metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        async with self._call("write_object", name):
            data = _read_source(source, size)
            if len(data) != size:
                raise emu.InvalidArgument(f"object_size is {size} but {len(data)} bytes were written")
            return _meta(self.model.put_object(self.bucket, name, data,
                                               emu.Preconditions(if_generation_match=if_generation_match),
                                               metadata=metadata))

    async def delete_object(self, name: str, *, if_generation_match: int | None = None) -> None:
        async with self._call("delete_object", name):
            self.model.delete_object(self.bucket, name, 0, emu.Preconditions(if_generation_match=if_generation_match))

    async def move_object(self, source: str, destination: str, *,
                          if_source_generation_match: int | None = None,
                          if_generation_match: int | None = None) -> ObjectMeta:
        async with self._call("move_object", source):
            return _meta(self.model.move_object(
                self.bucket, source, destination,
                source_preconditions=emu.Preconditions(if_generation_match=if_source_generation_match),
                destination_preconditions=emu.Preconditions(if_generation_match=if_generation_match)))

    async def update_metadata(self, name: str, generation: int, metadata: Mapping[str, str], *,
                              if_metageneration_match: int | None = None) -> ObjectMeta:
        async with self._call("update_metadata", name, pinned=True):
            conditions = emu.Preconditions(if_generation_match=generation,
                                           if_metageneration_match=if_metageneration_match)
            return _meta(self.model.update_object(self.bucket, name, generation, conditions,
                                                  metadata_patch=metadata))

    async def create_folder(self, prefix: str) -> FolderMeta:
        async with self._call("create_folder", prefix):  # the client never asks for recursive
            return _folder(self.model.create_folder(self.bucket, emu.folder_name(prefix)))

    async def delete_folder(self, prefix: str) -> None:
        async with self._call("delete_folder", prefix):
            self.model.delete_folder(self.bucket, emu.folder_name(prefix))

    async def rename_folder(self, source: str, destination: str) -> FolderMeta:
        async with self._call("rename_folder", source):
            return _folder(self.model.rename_folder(self.bucket, emu.folder_name(source),
                                                    emu.folder_name(destination)))

    # -- data -------------------------------------------------------------------------------------

    async def drain_page_stores(self, ino: int, epoch: int) -> None:
        return None

    def skip_page_store(self, ticket: int) -> None:
        return None

    def open_reader(self, name: str, generation: int) -> MemoryReader:
        return MemoryReader(self, name, generation)

    def open_appender(self, name: str) -> MemoryAppender:
        return MemoryAppender(self, name)

    def _whole(self, method: str, name: str, generation: int, length: int, *, bidi: bool) -> bytes | StorageError:
        if bidi:
            self.stream_events.on_read("open")
        try:
            self._take_fault(method, name)
            return self._read_once(name, generation, 0, length)
        except emu.StoreError as err:
            return self._error(method, err, name, bool(generation), "BidiReadObject" if bidi else "ReadObject")

    async def read_objects_whole(self, items: list[tuple[str, int, int]], *,
                                 concurrency: int) -> list[bytes | memoryview | StorageError]:
        self.calls["read_objects_whole"] += 1
        answers: list[bytes | memoryview | StorageError] = []
        for name, generation, length in items:
            await trio.lowlevel.checkpoint()
            answers.append(self._whole("read_objects_whole", name, generation, length, bidi=self.layout.bidi_reads))
        return answers

    async def read_objects_composed(self, items: list[tuple[str, int, int, int | None]], *, concurrency: int,
                                    temporary_name: Callable[[], str]
                                    ) -> list[bytes | memoryview | StorageError]:
        self.calls["read_objects_composed"] += 1
        parts: list[bytes | None] = []
        for start in range(0, len(items), COMPOSE_MAX_SOURCES):
            await trio.lowlevel.checkpoint()
            parts += self._compose(items[start:start + COMPOSE_MAX_SOURCES], temporary_name())
        answers: list[bytes | memoryview | StorageError] = []
        for index, part in enumerate(parts):
            if part is None:  # compose failed or a part's CRC32C differs: read alone, as the client does
                name, generation, size, _ = items[index]
                answers.append(self._whole("read_objects_whole", name, generation, size, bidi=False))
            else:
                answers.append(part)
        return answers

    def _compose(self, group: list[tuple[str, int, int, int | None]], temporary: str) -> list[bytes | None]:
        """As the client: compose the group into ``temporary``, read it, delete it; its parts, None where lost."""
        try:
            self._take_fault("read_objects_composed", *(name for name, _, _, _ in group))
            record = self.model.compose(self.bucket, temporary,
                                        [(name, generation, None) for name, generation, _, _ in group],
                                        emu.Preconditions(if_generation_match=0))
        except emu.StoreError as err:
            self.rpc_errors.add("ComposeObject", err.code)
            return [None] * len(group)
        data = self.model.read_all(self.bucket, temporary)
        self.model.delete_object(self.bucket, temporary, 0, emu.Preconditions(if_generation_match=record.generation))
        if len(data) != sum(size for _, _, size, _ in group):
            return [None] * len(group)
        parts: list[bytes | None] = []
        offset = 0
        for _, _, size, crc in group:
            part, offset = data[offset:offset + size], offset + size
            parts.append(part if crc is None or wire.crc32c(part) == crc else None)
        return parts


class MemoryReader:
    """With bidi reads the first read opens a stream pinned to the generation's
    bytes (they outlive a delete or overwrite, and show appends); without, every
    read is a call of its own."""

    def __init__(self, store: MemoryStore, name: str, generation: int) -> None:
        self._store, self.name, self.generation = store, name, generation
        self._stream: BlobReader | None = None
        self._closed = False

    @property
    def stream_open(self) -> bool:
        return self._stream is not None

    async def read(self, offset: int, length: int, *, pages: PageStore | None = None,
                   reply: Answer | None = None) -> bytes:
        if self._closed:
            raise StorageError(f"read {self.name!r}: the reader is closed", errno_=errno.EBADF, object_name=self.name)
        if length <= 0:
            return b""  # no call at all, as the client
        store = self._store
        try:
            async with store._call("reader.read", self.name, pinned=bool(self.generation)):
                if not store.layout.bidi_reads:  # at or past the end: empty, as the ReadObject client returns
                    return store._read_once(self.name, self.generation, offset, length)
                if self._stream is None:
                    store.stream_events.on_read("open")
                    record, self._stream = store.model.open_reader(store.bucket, self.name, self.generation)
                    self.generation = self.generation or record.generation
                size = self._stream.size()
                if offset > size:
                    raise emu.OutOfRange(f"read_offset {offset} is beyond the object size {size}")
                return self._stream.read(offset, min(length, size - offset))
        except StorageError:
            self._end_stream()  # any failure ends the stream; the next read opens another
            raise

    async def read_blocks(self, offset: int, lengths: list[int],
                          pages: list[PageStore | None] | None = None) -> list[bytes]:
        landed = []
        for length in lengths:
            landed.append(await self.read(offset, length))
            offset += length
        return landed

    def _end_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    async def close(self) -> None:
        self._closed = True
        self._end_stream()


class MemoryAppender:
    """The writer of one appendable object (when bytes persist: see the module docstring)."""

    def __init__(self, store: MemoryStore, name: str) -> None:
        self._store, self.name = store, name
        self.generation = self._epoch = self._persisted = 0
        self._pending = bytearray()
        self._stream = self._closed = False

    @property
    def stream_open(self) -> bool:
        return self._stream

    @asynccontextmanager
    async def _op(self, op: str) -> AsyncIterator[None]:
        if self._closed:
            self._store.calls[f"appender.{op}"] += 1
            raise StorageError(f"write {self.name!r}: the writer is closed", errno_=errno.EBADF, object_name=self.name)
        try:
            async with self._store._call(f"appender.{op}", self.name, pinned=bool(self.generation)):
                yield
        except StorageError:
            self._stream = False  # any failure ends the stream
            raise
        if not (self._stream or self._closed):  # the client opens another stream after a failure
            self._stream = True
            self._store.stream_events.on_write("open")

    def _persist(self, count: int) -> emu.ObjectRecord:
        """Persist ``count`` pending bytes at the persisted size: only while still the writer."""
        if not self.generation:
            raise emu.InvalidArgument("the appender was neither created nor took an object over")
        store = self._store
        if not count:
            return store.model.writer_state(store.bucket, self.name, self.generation, self._epoch)
        record = store.model.append(store.bucket, self.name, self.generation, self._epoch, self._persisted,
                                    bytes(self._pending[:count]))
        del self._pending[:count]
        self._persisted = record.size
        return record

    def _opened(self, record: emu.ObjectRecord) -> None:
        self.generation, self._epoch, self._persisted = record.generation, record.writer_epoch, record.size
        self._stream = True
        self._pending.clear()
        self._store.stream_events.on_write("open")

    async def create(self, *, if_generation_match: int | None = 0,
                     metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        store = self._store
        async with self._op("create"):
            record = store.model.create_appendable(store.bucket, self.name,
                                                   emu.Preconditions(if_generation_match=if_generation_match),
                                                   metadata=metadata)
            self._opened(record)
            return _meta(record)

    async def takeover(self, generation: int) -> int:
        self.generation = generation
        async with self._op("takeover"):
            # A takeover: the object's writer epoch moves on, which fences the last writer.
            record = self._store.model.open_appendable(self._store.bucket, self.name, generation)
            self._opened(record)
            return record.size

    def append_now(self, data: bytes | memoryview | Arriving) -> bool:
        return False  # every append is a call of the store (its faults and latency)

    async def append(self, data: bytes | memoryview | Arriving) -> None:
        async with self._op("append"):
            self._persist(0)
            self._pending += landed(data)
            self._persist(len(self._pending) - len(self._pending) % CHUNK)

    async def append_file(self, source: int, size: int) -> None:
        async with self._op("append_file"):
            self._persist(0)
            data = _read_source(source, size)
            if len(data) != size:
                raise emu.InvalidArgument(f"the source holds {len(data)} of {size} bytes")
            self._pending += data
            self._persist(len(self._pending) - len(self._pending) % CHUNK)

    async def flush(self) -> int:
        async with self._op("flush"):
            return self._persist(len(self._pending)).size

    async def finalize(self) -> ObjectMeta:
        store = self._store
        async with self._op("finalize"):
            self._persist(len(self._pending))
            record = store.model.finalize(store.bucket, self.name, self.generation, self._epoch)
            self._closed, self._stream = True, False
            return _meta(record)

    async def close(self) -> None:
        if self._closed:
            return
        try:
            async with self._op("close"):
                self._persist(len(self._pending))
        finally:
            self._closed, self._stream = True, False

    async def abort(self) -> None:
        self._closed, self._stream = True, False
        self._pending.clear()
