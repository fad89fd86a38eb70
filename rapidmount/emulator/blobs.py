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


class BlobReader(Protocol):
    def size(self) -> int: ...
    def read(self, offset: int, length: int) -> bytes: ...
    def close(self) -> None: ...


class MemoryBlobs:
    """Blobs as bytearrays. One lock: a bytearray cannot grow while a read
    holds a view of it, and appends and reads come from several threads."""

    durable = False

    def __init__(self) -> None:
        self._blobs: dict[int, bytearray] = {}
        self._lock = threading.Lock()

    def create(self, blob_id: int, pieces: Iterable[bytes] = ()) -> None:
        data = bytearray()
        for piece in pieces:
            data += piece
        with self._lock:
            self._blobs[blob_id] = data

    def append(self, blob_id: int, data: bytes) -> None:
        with self._lock:
            self._blobs[blob_id] += data

    def size(self, blob_id: int) -> int:
        with self._lock:
            return len(self._blobs[blob_id])

    def read(self, blob_id: int, offset: int, length: int) -> bytes:
        with self._lock:
            return _copy_range(self._blobs[blob_id], offset, length)

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


def _copy_range(data: bytearray, offset: int, length: int) -> bytes:
    # One copy into a fresh bytes; the views are released before returning,
    # so the bytearray can grow again.
    with memoryview(data) as view, view[offset:offset + length] as part:
        return bytes(part)


class _MemoryReader:
    def __init__(self, data: bytearray, lock: threading.Lock) -> None:
        self._data = data
        self._lock = lock

    def size(self) -> int:
        with self._lock:
            return len(self._data)

    def read(self, offset: int, length: int) -> bytes:
        with self._lock:
            return _copy_range(self._data, offset, length)

    def close(self) -> None:
        self._data = bytearray()


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

    def append(self, blob_id: int, data: bytes) -> None:
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
        with self._lock:
            fd = self._appenders.get(blob_id)
            if fd is not None:
                os.fsync(fd)
                return
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

    def sync_directory(self) -> None:
        """Make created and unlinked blob names durable."""
        fd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError as exc:  # already closed is fine
                if exc.errno != errno.EBADF:
                    raise
            self._fd = -1
