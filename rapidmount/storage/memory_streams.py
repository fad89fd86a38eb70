"""MemoryStore's readers and appenders: streams over the in-memory bucket."""

from __future__ import annotations

import errno
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from rapidmount.emulator import store as emu
from rapidmount.storage.errors import StorageError
from rapidmount.storage.memory_objects import CHUNK, Blob, StoredObject, check_preconditions, meta_of
from rapidmount.storage.model import ObjectMeta

if TYPE_CHECKING:
    from rapidmount.storage.memory import MemoryStore


class MemoryReader:
    """With bidi reads the first read opens a stream pinned to the generation's
    bytes (they outlive a delete or overwrite, and show appends); without, every
    read is a call of its own, and ``idle`` stays True as the client's."""

    def __init__(self, store: MemoryStore, name: str, generation: int) -> None:
        self._store, self.name, self.generation = store, name, generation
        self._blob: Blob | None = None
        self._opened = self._closed = False

    @property
    def idle(self) -> bool:
        return not self._opened

    @property
    def stream_open(self) -> bool:
        return self._blob is not None

    async def read(self, offset: int, length: int, *, pages=None) -> bytes:
        if self._closed:
            raise StorageError(f"read {self.name!r}: the reader is closed", errno_=errno.EBADF, object_name=self.name)
        if length <= 0:
            return b""  # no call at all, as the client
        store = self._store
        try:
            async with store._call("reader.read", self.name, pinned=bool(self.generation)):
                if not store.layout.bidi_reads:  # at or past the end: empty, as the ReadObject client returns
                    return bytes(store._live(self.name, self.generation).blob.data[offset:offset + length])
                if self._blob is None:
                    self._opened = True
                    store.stream_events.on_read("open")
                    obj = store._live(self.name, self.generation)
                    self.generation, self._blob = self.generation or obj.generation, obj.blob
                if offset > len(self._blob.data):
                    raise emu.OutOfRange(f"read_offset {offset} is beyond the object size {len(self._blob.data)}")
                return bytes(self._blob.data[offset:offset + length])
        except StorageError:
            self._blob = None  # any failure ends the stream; the next read opens another
            raise

    async def close(self) -> None:
        self._closed, self._blob = True, None


class MemoryAppender:
    """The writer of one appendable object (when bytes persist: see the module docstring)."""

    def __init__(self, store: MemoryStore, name: str) -> None:
        self._store, self.name = store, name
        self.generation = self._epoch = 0
        self._pending = bytearray()
        self._stream = self._closed = False

    @property
    def stream_open(self) -> bool:
        return self._stream

    @asynccontextmanager
    async def _op(self, op: str):
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

    def _persist(self, count: int) -> StoredObject:
        """Persist ``count`` pending bytes, as the emulator's writer: only while still the writer."""
        if not self.generation:
            raise emu.InvalidArgument("the appender was neither created nor took an object over")
        obj = self._store._live(self.name, self.generation)
        if obj.finalized:
            raise emu.FailedPrecondition(f"object {self.name!r} is finalized")
        if obj.writer_epoch != self._epoch:
            raise emu.FailedPrecondition("a different writer has become the exclusive writer (takeover)")
        if count:
            obj.blob.append(bytes(self._pending[:count]))
            del self._pending[:count]
            obj = self._store._place(replace(obj, update_ns=self._store._clock()))
        return obj

    def _opened(self, obj: StoredObject) -> None:
        self.generation, self._epoch, self._stream = obj.generation, obj.writer_epoch, True
        self._pending.clear()
        self._store.stream_events.on_write("open")

    async def create(self, *, if_generation_match: int | None = 0,
                     metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        store = self._store
        async with self._op("create"):
            emu.validate_object_name(self.name)
            if not store.layout.appendable_objects:
                raise emu.FailedPrecondition(f"bucket {store.bucket!r} is not zonal: no appendable objects")
            emu.check_folder_limits(self.name)
            check_preconditions(store._objects.get(self.name), if_generation_match)
            obj = store._new(self.name, Blob(), False, metadata)
            self._opened(obj)
            return meta_of(obj)

    async def takeover(self, generation: int) -> int:
        self.generation = generation
        async with self._op("takeover"):
            obj = self._store._live(self.name, generation)
            if obj.finalized:
                raise emu.FailedPrecondition(f"object {self.name!r} is finalized; it can no longer be appended to")
            obj = self._store._place(replace(obj, writer_epoch=obj.writer_epoch + 1))  # fences the last writer
            self._opened(obj)
            return len(obj.blob.data)

    async def append(self, data: bytes) -> None:
        async with self._op("append"):
            self._persist(0)
            self._pending += data
            self._persist(len(self._pending) - len(self._pending) % CHUNK)

    async def flush(self) -> int:
        async with self._op("flush"):
            return len(self._persist(len(self._pending)).blob.data)

    async def finalize(self) -> ObjectMeta:
        async with self._op("finalize"):
            obj = self._persist(len(self._pending))
            obj = self._store._place(replace(obj, finalized=True, update_ns=self._store._clock()))
            self._closed, self._stream = True, False
            return meta_of(obj)

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
