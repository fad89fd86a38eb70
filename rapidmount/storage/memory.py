"""An in-memory bucket behind the storage seam, for core tests without FUSE or gRPC.

:class:`MemoryStore` is an :class:`~rapidmount.storage.seam.ObjectStore` with
the semantics of rapidmount's emulator (``rapidmount/emulator/store.py``) as
the gRPC client surfaces them. Every call awaits one trio checkpoint, then runs
to completion: each call is atomic, as one RPC is.

Test hooks (synchronous; only ``fail_next`` affects the seam's calls):

* ``store.fail_next(method, code, times=1, match=None)``: the next ``times``
  calls of ``method`` (whose object name satisfies ``match``, if given) raise
  ``StorageError`` with ``code`` and do nothing else. ``method`` is a store
  method (``"write_object"``, ``"list_page"``, ...) or ``"reader.read"``,
  ``"appender.create"``, ``.takeover``, ``.append``, ``.flush``, ``.finalize``,
  ``.close``. In ``read_objects_whole`` a fault fails one item (returned as a
  value); in ``read_objects_composed`` one group's compose (matched against
  its sources), which falls back to whole reads. ``store.clear_faults()``.
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

import bisect
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace

import google_crc32c
import grpc
import trio

from rapidmount.emulator import listing
from rapidmount.emulator import store as emu
from rapidmount.storage.counters import RpcErrorCounts, StreamEvents
from rapidmount.storage.errors import StorageError, errno_for
from rapidmount.storage.memory_objects import (
    CHUNK, RPC_OF, Blob, Fault, StoredObject, check_preconditions, folder_id, meta_of, page_size_of, refusal)
from rapidmount.storage.memory_streams import MemoryAppender, MemoryReader
from rapidmount.storage.model import BucketLayout, ListPage, ObjectMeta
from rapidmount.storage.seam import COMPOSE_MAX_SOURCES, LIST_PAGE_SIZE, UploadSource

__all__ = ["MemoryStore", "BUCKET_KINDS"]

#: kind -> (location_type, hierarchical_namespace), as the emulator reports them
BUCKET_KINDS = {"zonal": ("zone", True), "hns": ("region", True), "flat": ("region", False)}

class MemoryStore:
    """One in-memory bucket: ``MemoryStore(bucket="b", kind="zonal" | "hns" | "flat")``."""

    def __init__(self, bucket: str = "b", kind: str = "zonal", *,
                 clock: Callable[[], int] = time.time_ns) -> None:
        location_type, hns = BUCKET_KINDS[kind]
        self.bucket, self.kind = bucket, kind
        self.layout = BucketLayout(name=bucket, location=emu.REGION, location_type=location_type,
                                   hierarchical_namespace=hns)
        self.stream_events = StreamEvents()
        self.rpc_errors = RpcErrorCounts()
        self.stores_pages = False  # no kernel behind it
        self.calls: Counter[str] = Counter()
        self._clock = clock
        self._objects: dict[str, StoredObject] = {}
        self._folders: set[str] = set()
        self._faults: list[Fault] = []
        self._holds: dict[str, trio.Event] = {}
        self._last_generation = 0

    # -- test hooks -------------------------------------------------------------------------------

    def fail_next(self, method: str, code: grpc.StatusCode, times: int = 1,
                  match: Callable[[str], bool] | None = None) -> None:
        if method not in RPC_OF:
            raise ValueError(f"unknown method {method!r}; one of {', '.join(sorted(RPC_OF))}")
        self._faults.append(Fault(method, code, times, match))

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
        return meta_of(self._new(name, Blob(data), finalized, metadata))

    def append_external(self, name: str, data: bytes) -> ObjectMeta:
        obj = self._take_over_externally(name)
        obj.blob.append(data)
        return meta_of(self._place(replace(obj, update_ns=self._clock())))

    def finalize_external(self, name: str) -> ObjectMeta:
        obj = self._take_over_externally(name)
        return meta_of(self._place(replace(obj, finalized=True, update_ns=self._clock())))

    def _take_over_externally(self, name: str) -> StoredObject:
        obj = self._objects[name]
        if obj.finalized:
            raise ValueError(f"{name!r} is finalized")
        return self._place(replace(obj, writer_epoch=obj.writer_epoch + 1))

    def delete_external(self, name: str) -> None:
        del self._objects[name]

    def data(self, name: str) -> bytes:
        return bytes(self._objects[name].blob.data)

    def meta(self, name: str) -> ObjectMeta | None:
        return meta_of(self._objects[name]) if name in self._objects else None

    def names(self) -> list[str]:
        return sorted(self._objects)

    def folder_names(self) -> list[str]:
        return sorted(self._folders)

    # -- plumbing ---------------------------------------------------------------------------------

    def _next_generation(self) -> int:
        # The emulator's: the microsecond clock, forced monotonic.
        self._last_generation = max(self._clock() // 1000, self._last_generation + 1)
        return self._last_generation

    def _place(self, obj: StoredObject) -> StoredObject:
        self._objects[obj.name] = obj
        if self.layout.folders:  # on HNS buckets an object creates its parent folders
            self._folders.update(emu.parent_folders(obj.name))
        return obj

    def _new(self, name: str, blob: Blob, finalized: bool, metadata: Mapping[str, str] | None) -> StoredObject:
        now = self._clock()
        return self._place(StoredObject(name, self._next_generation(), 1, blob, finalized, now, now,
                                   dict(metadata or {})))

    def _take_fault(self, method: str, *names: str) -> None:
        for fault in self._faults:
            if fault.method == method and (fault.match is None or any(map(fault.match, names))):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                raise refusal(fault.code, f"injected {fault.code.name}")

    def _error(self, method: str, err: emu.StoreError, name: str | None, pinned: bool,
               rpc: str | None = None) -> StorageError:
        code = grpc.StatusCode[err.code]
        read_rpc = "BidiReadObject" if self.layout.bidi_reads else "ReadObject"
        self.rpc_errors.add(rpc or RPC_OF[method] or read_rpc, code)
        return StorageError(f"{method} {name!r}: {code.name}: {err}", code=code, object_name=name,
                            errno_=errno_for(code, pinned_generation=pinned))

    @asynccontextmanager
    async def _call(self, method: str, name: str = "", *, pinned: bool = False):
        """One call of the seam: counted, a checkpoint, an injected fault, refusals mapped."""
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

    def _live(self, name: str, generation: int = 0) -> StoredObject:
        obj = self._objects.get(name)
        if obj is None or (generation and obj.generation != generation):
            what = f"generation {generation} of " if generation else ""
            raise emu.NotFound(f"{what}object {name!r} does not exist")
        return obj

    def _need_folders(self) -> None:
        if not self.layout.folders:
            raise emu.FailedPrecondition(f"bucket {self.bucket!r} has no hierarchical namespace")

    # -- metadata ---------------------------------------------------------------------------------

    async def get_object(self, name: str, generation: int = 0) -> ObjectMeta | None:
        async with self._call("get_object", name):
            obj = self._objects.get(name)
            if obj is None or (generation and obj.generation != generation):
                self.rpc_errors.add("GetObject", "NOT_FOUND")  # what the client sees before it returns None
                return None
            return meta_of(obj)

    async def stat_name(self, name: str) -> tuple[ObjectMeta | None, bool]:
        async with self._call("stat_name", name):
            obj, directory = self._objects.get(name), name + "/"
            if self.layout.folders:  # every object's parent folders exist: folders alone decide
                is_dir = directory in self._folders
            else:
                names = sorted(self._objects)
                index = bisect.bisect_left(names, directory)
                is_dir = index < len(names) and names[index].startswith(directory)
            return (meta_of(obj) if obj else None), is_dir

    @staticmethod
    def _bounds(prefix: str, start: str, end: str, page_token: str) -> tuple[str, str | None]:
        """The emulator's scan range: [lower, upper) from prefix, start/end and the page token."""
        lower = max(prefix, start)
        if page_token:
            try:
                lower = max(lower, listing.decode_page_token(page_token))
            except ValueError as exc:
                raise emu.InvalidArgument(str(exc)) from None
        upper = listing.successor(prefix) if prefix else None
        if end and (upper is None or end < upper):
            upper = end
        return lower, upper

    @staticmethod
    def _scan(names: list[str], row: Callable[[str], object], bounds: tuple[str, str | None]) -> listing.NameScan:
        def fetch(lo: str, hi: str | None, limit: int) -> list:
            first = bisect.bisect_left(names, lo)
            last = len(names) if hi is None else bisect.bisect_left(names, hi)
            return [(name, row(name)) for name in names[first:min(last, first + limit)]]
        return listing.NameScan(fetch, *bounds)

    def _list(self, prefix: str, delimiter: str = "/", page_token: str = "", page_size: int = LIST_PAGE_SIZE,
              start: str = "", end: str = "", include_trailing_delimiter: bool = False) -> ListPage:
        page_size = page_size_of(page_size)
        bounds = self._bounds(prefix, start, end, page_token)
        stream = listing.entries(self._scan(sorted(self._objects), self._objects.get, bounds), prefix, delimiter)
        if self.layout.folders and delimiter == "/":  # empty folders are prefixes too
            folders = self._scan(sorted(self._folders), lambda name: None, bounds)
            stream = listing.merge_entries(stream, listing.child_folder_prefixes(folders, prefix))
        page = listing.paginate(stream, page_size, include_trailing_delimiter)
        return ListPage([meta_of(row[1]) for row in page.objects], page.prefixes, page.next_page_token)

    async def list_page(self, prefix: str, *, delimiter: str = "/", page_token: str = "",
                        page_size: int = LIST_PAGE_SIZE, start: str = "", end: str = "",
                        include_trailing_delimiter: bool = False) -> ListPage:
        async with self._call("list_page", prefix):
            return self._list(prefix, delimiter, page_token, page_size, start, end, include_trailing_delimiter)

    async def list_folders_page(self, prefix: str, *, page_token: str = "", page_size: int = LIST_PAGE_SIZE,
                                start: str = "", end: str = "") -> tuple[list[str], str]:
        async with self._call("list_folders_page", prefix):
            self._need_folders()
            if prefix and not prefix.endswith("/"):
                raise emu.InvalidArgument("ListFolders prefix must be empty or end with '/'")
            page_size = page_size_of(page_size)
            lower, upper = self._bounds(prefix, start, end, page_token)
            names = [n for n in sorted(self._folders) if lower <= n and (upper is None or n < upper)]
            if len(names) > page_size:
                return names[:page_size], listing.encode_page_token(names[page_size])
            return names, ""

    async def list_directory(self, prefix: str, *, delimiter: str = "/",
                             limit: int | None = None) -> tuple[list[ObjectMeta], list[str], bool]:
        objects: list[ObjectMeta] = []
        prefixes: list[str] = []
        token = ""
        async with self._call("list_directory", prefix):
            while True:
                page = self._list(prefix, delimiter, token)
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
            emu.validate_object_name(name)
            data = b"".join(os.pread(source, min(CHUNK, size - offset), offset) for offset in range(0, size, CHUNK)
                            ) if source is not None else b""
            if len(data) != size:
                raise emu.InvalidArgument(f"object_size is {size} but {len(data)} bytes were written")
            emu.check_folder_limits(name)
            check_preconditions(self._objects.get(name), if_generation_match)
            return meta_of(self._new(name, Blob(data), True, metadata))

    async def delete_object(self, name: str, *, if_generation_match: int | None = None) -> None:
        async with self._call("delete_object", name):
            check_preconditions(self._live(name), if_generation_match)
            del self._objects[name]

    async def move_object(self, source: str, destination: str, *,
                          if_source_generation_match: int | None = None,
                          if_generation_match: int | None = None) -> ObjectMeta:
        async with self._call("move_object", source):
            emu.validate_object_name(destination)
            if source == destination:
                raise emu.InvalidArgument("source and destination objects must differ")
            emu.check_folder_limits(destination)
            obj = self._live(source)
            check_preconditions(obj, if_source_generation_match)
            check_preconditions(self._objects.get(destination), if_generation_match)
            del self._objects[source]
            now = self._clock()
            # The bytes stay; the destination is a new generation with a fresh writer epoch.
            return meta_of(self._place(replace(obj, name=destination, generation=self._next_generation(),
                                             metageneration=1, create_ns=now, update_ns=now, writer_epoch=1)))

    async def update_metadata(self, name: str, generation: int, metadata: Mapping[str, str], *,
                              if_metageneration_match: int | None = None) -> ObjectMeta:
        async with self._call("update_metadata", name, pinned=True):
            obj = self._live(name, generation)
            check_preconditions(obj, generation, if_metageneration_match)
            return meta_of(self._place(replace(obj, metageneration=obj.metageneration + 1, update_ns=self._clock(),
                                             metadata={**obj.metadata, **metadata})))

    async def create_folder(self, prefix: str) -> None:
        async with self._call("create_folder", prefix):
            prefix = folder_id(prefix)
            emu.validate_folder_name(prefix)
            self._need_folders()
            if prefix in self._folders:
                raise emu.AlreadyExists(f"folder {prefix!r} already exists")
            parent = emu.parent_folder(prefix)
            if parent and parent not in self._folders:  # the client never asks for recursive
                raise emu.FailedPrecondition(f"parent folder {parent!r} does not exist")
            self._folders.add(prefix)

    async def delete_folder(self, prefix: str) -> None:
        async with self._call("delete_folder", prefix):
            prefix = folder_id(prefix)
            self._need_folders()
            if prefix not in self._folders:
                raise emu.NotFound(f"folder {prefix!r} does not exist")
            if any(n.startswith(prefix) for n in self._objects) or any(
                    f.startswith(prefix) and f != prefix for f in self._folders):
                raise emu.FailedPrecondition(f"folder {prefix!r} is not empty")
            self._folders.discard(prefix)

    async def rename_folder(self, source: str, destination: str) -> None:
        async with self._call("rename_folder", source):
            source, destination = folder_id(source), folder_id(destination)
            emu.validate_folder_name(destination)
            self._need_folders()
            if source not in self._folders:
                raise emu.NotFound(f"folder {source!r} does not exist")
            if destination.startswith(source):
                raise emu.InvalidArgument(f"cannot rename folder {source!r} into itself ({destination!r})")
            if destination in self._folders:
                raise emu.AlreadyExists(f"destination folder {destination!r} already exists")
            parent = emu.parent_folder(destination)
            if parent and parent not in self._folders:
                raise emu.FailedPrecondition(f"destination parent folder {parent!r} does not exist")
            moving = [obj for name, obj in self._objects.items() if name.startswith(source)]
            for obj in moving:
                emu.check_folder_limits(destination + obj.name[len(source):])
            folders = {f for f in self._folders if f.startswith(source)}
            self._folders = (self._folders - folders) | {destination + f[len(source):] for f in folders}
            now = self._clock()
            for obj in moving:
                del self._objects[obj.name]
            for obj in moving:  # generations stay; the metageneration counts the change
                self._place(replace(obj, name=destination + obj.name[len(source):],
                                    metageneration=obj.metageneration + 1, update_ns=now))

    # -- data -------------------------------------------------------------------------------------

    async def drain_page_stores(self, nodeid: int, epoch: int) -> None:
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
            return bytes(self._live(name, generation).blob.data[:length])
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
        answers: list = []
        for start in range(0, len(items), COMPOSE_MAX_SOURCES):
            await trio.lowlevel.checkpoint()
            answers += self._compose(items[start:start + COMPOSE_MAX_SOURCES], temporary_name())
        for index, answer in enumerate(answers):
            if answer is None:  # compose failed or a part's CRC32C differs: read alone, as the client does
                name, generation, size, _ = items[index]
                answers[index] = self._whole("read_objects_whole", name, generation, size, bidi=False)
        return answers

    def _compose(self, group: list[tuple[str, int, int, int | None]], temporary: str) -> list:
        try:
            self._take_fault("read_objects_composed", *(name for name, _, _, _ in group))
            if not self.layout.compose:
                raise emu.FailedPrecondition("ComposeObject is not supported on zonal (Rapid) buckets")
            sources = [self._live(name, generation) for name, generation, _, _ in group]
            if not all(obj.finalized for obj in sources):
                raise emu.FailedPrecondition("a source object is not finalized")
        except emu.StoreError as err:
            self.rpc_errors.add("ComposeObject", err.code)
            return [None] * len(group)
        self._next_generation()
        if self.layout.folders:  # the temporary object is deleted at once, but its folders stay
            self._folders.update(emu.parent_folders(temporary))
        data = b"".join(bytes(obj.blob.data) for obj in sources)
        if len(data) != sum(size for _, _, size, _ in group):
            return [None] * len(group)
        parts, offset = [], 0
        for _, _, size, crc in group:
            part, offset = data[offset:offset + size], offset + size
            parts.append(part if crc is None or google_crc32c.value(part) == crc else None)
        return parts
