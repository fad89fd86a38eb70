"""Where a write stream's bytes go, and how each data message is taken.

``AppendTarget`` appends to an unfinalized appendable object under one
writer epoch; ``StagedTarget`` stages a one-shot upload that stays invisible
until finish_write. ``Upload`` checks and persists the data of each
message, for WriteObject and BidiWriteObject alike. Writes are not paced.
"""

from __future__ import annotations

import asyncio
from typing import Any

import google_crc32c

from rapidmount.shared import wire

from . import convert, handles
from .rpc import Environment, invalid
from .store import ObjectRecord, Store
from .store_appends import bytes_beyond
from .stream_faults import StreamMeter


class AppendTarget:
    """An unfinalized appendable object, written under one writer epoch."""

    def __init__(self, store: Store, record: ObjectRecord) -> None:
        self._store = store
        self.record = record

    def write_handle(self) -> bytes:
        record = self.record
        return handles.write_handle(record.bucket, record.name, record.generation, record.writer_epoch)

    def append(self, offset: int, data: bytes, crc32c: int | None = None) -> None:
        record = self.record
        self.record = self._store.append(record.bucket, record.name, record.generation,
                                         record.writer_epoch, offset, data, crc32c)

    def state(self) -> tuple[int, int]:
        """Persisted size and crc32c; fails if this writer was fenced."""
        record = self.record
        self.record = self._store.writer_state(record.bucket, record.name, record.generation,
                                               record.writer_epoch)
        return self.record.size, self.record.crc32c

    async def flush(self) -> None:
        self.state()
        if self._store.blobs.durable:
            await asyncio.to_thread(self._store.sync, self.record)

    async def finish(self, checksums: Any | None) -> ObjectRecord:
        record = self.record
        # In a worker thread: finalizing may hash and fsync the whole object.
        self.record = await asyncio.to_thread(
            self._store.finalize, record.bucket, record.name, record.generation, record.writer_epoch,
            expected_crc32c=_expected_crc32c(checksums), expected_md5=_expected_md5(checksums))
        return self.record

    def close(self) -> None:
        """Nothing to release: appended bytes are already part of the object."""


class StagedTarget:
    """A one-shot (non-appendable) upload, invisible until finish_write."""

    def __init__(self, store: Store, bucket: str, name: str, spec: Any) -> None:
        self._store = store
        self._bucket = bucket
        self._name = name
        self._spec = spec
        self._size = 0
        self._crc = 0
        self._blob_id: int | None = store.begin_upload()

    def append(self, offset: int, data: bytes, crc32c: int | None = None) -> None:
        assert self._blob_id is not None
        data = bytes_beyond(offset, self._size, data)
        if data:
            self._store.upload_append(self._blob_id, data)
            self._size += len(data)
            self._crc = google_crc32c.extend(self._crc, data)

    def state(self) -> tuple[int, int]:
        return self._size, self._crc

    async def flush(self) -> None:
        """Staged bytes become durable when the object is committed."""

    async def finish(self, checksums: Any | None) -> ObjectRecord:
        assert self._blob_id is not None
        spec, resource = self._spec, self._spec.resource
        if spec.HasField("object_size") and spec.object_size != self._size:
            raise invalid(f"write_object_spec.object_size is {spec.object_size} but "
                          f"{self._size} bytes were written")
        blob_id, self._blob_id = self._blob_id, None  # commit_upload owns it now
        # In a worker thread: committing checksums (and may fsync) the whole object.
        return await asyncio.to_thread(
            self._store.commit_upload,
            blob_id, self._bucket, self._name, convert.preconditions(spec),
            metadata=dict(resource.metadata), content_type=resource.content_type,
            storage_class=resource.storage_class, expected_crc32c=_expected_crc32c(checksums),
            expected_md5=_expected_md5(checksums))

    def close(self) -> None:
        if self._blob_id is not None:
            self._store.abort_upload(self._blob_id)
            self._blob_id = None


def _expected_crc32c(checksums: Any | None) -> int | None:
    return checksums.crc32c if checksums is not None and checksums.HasField("crc32c") else None


def _expected_md5(checksums: Any | None) -> bytes | None:
    return checksums.md5_hash if checksums is not None and checksums.md5_hash else None


class Upload:
    """Data handling shared by WriteObject and BidiWriteObject messages."""

    def __init__(self, env: Environment, method: str, name: str, target: AppendTarget | StagedTarget):
        self.target = target
        self.checksums: Any | None = None
        self._meter = StreamMeter(env.faults, "broken-write", method, name)

    def take(self, request: Any) -> bool:
        """Persist the message's data (if any); True if it carried data."""
        if request.HasField("object_checksums"):
            self.checksums = request.object_checksums
        if not request.HasField("checksummed_data"):
            return False
        chunk = request.checksummed_data
        data = chunk.content
        if len(data) > wire.MAX_CHUNK_BYTES:
            raise invalid(f"checksummed_data carries {len(data)} bytes; the limit is {wire.MAX_CHUNK_BYTES}")
        verified = None
        if chunk.HasField("crc32c"):
            if google_crc32c.value(data) != chunk.crc32c:
                raise invalid(f"checksummed_data.crc32c {chunk.crc32c} does not match the {len(data)} bytes "
                              f"at write_offset {request.write_offset}")
            verified = chunk.crc32c  # kept with the stored bytes: reads need no second pass
        count, broken = self._meter.allowance(len(data))
        if broken:
            self.target.append(request.write_offset, data[:count])
        else:
            self.target.append(request.write_offset, data, verified)
        self._meter.add(count)
        if broken:
            raise self._meter.broken()
        return True
