"""Object bytes: in memory, or one file per blob under a directory.

A blob is identified by an integer id (the generation it was created with;
it keeps that id when the object is moved or renamed). Blobs only grow
(appends) until they are deleted whole. Readers get a ``BlobReader`` that
stays valid after the blob is deleted or replaced, so a read stream that
pinned a generation can finish it.
"""

from __future__ import annotations

import collections
import errno
import os
import threading
from pathlib import Path
from typing import Iterable, Protocol

import google_crc32c

from rapidmount.shared import wire

SEGMENT_BYTES = wire.MAX_CHUNK_BYTES  # the largest read chunk, so aligned chunks are whole segments


class BlobReader(Protocol):
    def size(self) -> int: ...
    def read(self, offset: int, length: int) -> bytes: ...
    def read_chunk(self, offset: int, length: int) -> tuple[bytes, int]: ...
    def close(self) -> None: ...


class _SegmentedBytes:
    """Bytes kept as sealed, immutable 2 MiB ``bytes`` segments plus a growing
    tail. A read of a whole segment returns the segment itself and its
    checksum, computed once on first read: no copy, and no repeated pass."""

    __slots__ = ("sealed", "crcs", "tail")

    def __init__(self) -> None:
        self.sealed: list[bytes] = []
        self.crcs: list[int | None] = []
        self.tail = bytearray()

    def size(self) -> int:
        return len(self.sealed) * SEGMENT_BYTES + len(self.tail)

    def append(self, data: bytes, crc32c: int | None = None) -> None:
        """``crc32c``: the checksum of ``data`` if the caller knows it (a
        verified upload chunk); an aligned whole segment then needs no pass."""
        if not self.tail and len(data) == SEGMENT_BYTES and type(data) is bytes:
            self._seal(data, crc32c)  # the common aligned 2 MiB write: keep the caller's bytes as is
            return
        view = memoryview(data)
        while view:
            take = min(SEGMENT_BYTES - len(self.tail), len(view))
            self.tail += view[:take]
            view = view[take:]
            if len(self.tail) == SEGMENT_BYTES:
                self._seal(bytes(self.tail))
                self.tail = bytearray()

    def _seal(self, segment: bytes, crc32c: int | None = None) -> None:
        self.sealed.append(segment)
        self.crcs.append(crc32c)

    def read(self, offset: int, length: int) -> bytes:
        parts = []
        end = offset + length
        while offset < end:
            index, start = divmod(offset, SEGMENT_BYTES)
            take = min(SEGMENT_BYTES - start, end - offset)
            if index < len(self.sealed):
                segment = self.sealed[index]
                parts.append(segment if take == SEGMENT_BYTES else segment[start:start + take])
            else:
                with memoryview(self.tail) as view, view[start:start + take] as part:
                    parts.append(bytes(part))
            offset += take
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_chunk(self, offset: int, length: int) -> tuple[bytes, int]:
        index, start = divmod(offset, SEGMENT_BYTES)
        if start == 0 and length == SEGMENT_BYTES and index < len(self.sealed):
            segment, crc = self.sealed[index], self.crcs[index]
            if crc is None:
                crc = self.crcs[index] = google_crc32c.value(segment)
            return segment, crc
        data = self.read(offset, length)
        return data, google_crc32c.value(data)


class MemoryBlobs:
    """Blobs in memory. One lock: appends and reads come from several threads."""

    durable = False

    def __init__(self) -> None:
        self._blobs: dict[int, _SegmentedBytes] = {}
        self._lock = threading.Lock()

    def create(self, blob_id: int, pieces: Iterable[bytes] = ()) -> None:
        blob = _SegmentedBytes()
        for piece in pieces:
            blob.append(piece)
        with self._lock:
            self._blobs[blob_id] = blob

    def append(self, blob_id: int, data: bytes, crc32c: int | None = None) -> None:
        with self._lock:
            self._blobs[blob_id].append(data, crc32c)

    def size(self, blob_id: int) -> int:
        with self._lock:
            return self._blobs[blob_id].size()

    def read(self, blob_id: int, offset: int, length: int) -> bytes:
        with self._lock:
            return self._blobs[blob_id].read(offset, length)

    def open_reader(self, blob_id: int) -> BlobReader:
        with self._lock:
            return _MemoryReader(self._blobs[blob_id], self._lock)

    def sync(self, blob_id: int) -> None:
        """Nothing to do: memory is as durable as this store gets."""

    def release(self, blob_id: int) -> None:
        """Nothing to do: no per-blob resources."""

    def delete(self, blob_id: int) -> None:
        with self._lock:
            self._blobs.pop(blob_id, None)

    def ids(self) -> set[int]:
        with self._lock:
            return set(self._blobs)

    def close(self) -> None:
        with self._lock:
            self._blobs.clear()


class _MemoryReader:
    """Holds the blob itself, so it outlives a delete or overwrite."""

    def __init__(self, blob: _SegmentedBytes, lock: threading.Lock) -> None:
        self._blob: _SegmentedBytes | None = blob
        self._lock = lock

    def _open_blob(self) -> _SegmentedBytes:
        if self._blob is None:
            raise ValueError("read from a closed blob reader")
        return self._blob

    def size(self) -> int:
        with self._lock:
            return self._open_blob().size()

    def read(self, offset: int, length: int) -> bytes:
        with self._lock:
            return self._open_blob().read(offset, length)

    def read_chunk(self, offset: int, length: int) -> tuple[bytes, int]:
        with self._lock:
            return self._open_blob().read_chunk(offset, length)

    def close(self) -> None:
        self._blob = None


class FileBlobs:
    """One file per blob. Appends go through a bounded cache of open fds."""

    durable = True
    _MAX_OPEN_APPENDERS = 128

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._appenders: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _path(self, blob_id: int) -> Path:
        return self._dir / f"{blob_id}.blob"

    def create(self, blob_id: int, pieces: Iterable[bytes] = ()) -> None:
        fd = os.open(self._path(blob_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for piece in pieces:
                _write_all(fd, piece)
        finally:
            os.close(fd)

    def _appender(self, blob_id: int) -> int:
        # Caller holds self._lock.
        fd = self._appenders.get(blob_id)
        if fd is not None:
            self._appenders.move_to_end(blob_id)
            return fd
        fd = os.open(self._path(blob_id), os.O_WRONLY | os.O_APPEND)
        self._appenders[blob_id] = fd
        while len(self._appenders) > self._MAX_OPEN_APPENDERS:
            _, oldest = self._appenders.popitem(last=False)
            os.close(oldest)
        return fd

    def append(self, blob_id: int, data: bytes, crc32c: int | None = None) -> None:
        with self._lock:
            _write_all(self._appender(blob_id), data)

    def size(self, blob_id: int) -> int:
        return os.stat(self._path(blob_id)).st_size

    def read(self, blob_id: int, offset: int, length: int) -> bytes:
        fd = os.open(self._path(blob_id), os.O_RDONLY)
        try:
            return _pread_all(fd, offset, length)
        finally:
            os.close(fd)

    def open_reader(self, blob_id: int) -> BlobReader:
        return _FileReader(os.open(self._path(blob_id), os.O_RDONLY))

    def sync(self, blob_id: int) -> None:
        # Any fd of the file flushes its data; a private one keeps the lock free.
        fd = os.open(self._path(blob_id), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def release(self, blob_id: int) -> None:
        """Close the append fd of a blob that will not grow any more."""
        with self._lock:
            fd = self._appenders.pop(blob_id, None)
        if fd is not None:
            os.close(fd)

    def delete(self, blob_id: int) -> None:
        self.release(blob_id)
        try:
            os.unlink(self._path(blob_id))
        except FileNotFoundError:
            pass

    def ids(self) -> set[int]:
        found = set()
        for path in self._dir.glob("*.blob"):
            try:
                found.add(int(path.stem))
            except ValueError:
                continue
        return found

    def close(self) -> None:
        with self._lock:
            fds = list(self._appenders.values())
            self._appenders.clear()
        for fd in fds:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _pread_all(fd: int, offset: int, length: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _FileReader:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def read(self, offset: int, length: int) -> bytes:
        return _pread_all(self._fd, offset, length)

    def read_chunk(self, offset: int, length: int) -> tuple[bytes, int]:
        data = _pread_all(self._fd, offset, length)
        return data, google_crc32c.value(data)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError as exc:  # already closed is fine
                if exc.errno != errno.EBADF:
                    raise
            self._fd = -1
