"""Appendable objects: created unfinalized, grown by one fenced writer, then finalized.

Every takeover bumps the object's writer epoch; a write carrying an older
epoch fails with FailedPrecondition.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import google_crc32c

from .blob_digests import md5_of
from .store_errors import FailedPrecondition, InvalidArgument, NotFound, OutOfRange
from .store_index import StoreIndex
from .store_names import check_folder_limits, validate_object_name
from .store_preconditions import NO_PRECONDITIONS, Preconditions
from .store_records import ObjectRecord
from .resources import object_bytes


def bytes_beyond(offset: int, persisted: int, data: bytes) -> bytes:
    """The part of ``data``, written at ``offset``, that lies beyond ``persisted``.

    Bytes below the persisted size are skipped unchecked (as the Storage v2
    WriteObject contract says); an offset beyond it would leave a gap.
    """
    if offset > persisted:
        raise OutOfRange(f"write_offset {offset} is beyond the persisted size {persisted}")
    overlap = persisted - offset
    if overlap >= len(data):
        return b""
    return data[overlap:] if overlap else data


class Appends(StoreIndex):
    """The appendable-object writes of ``Store``."""

    def create_appendable(self, bucket: str, name: str,
                          preconditions: Preconditions = NO_PRECONDITIONS, *,
                          metadata: Mapping[str, str] | None = None, content_type: str = "",
                          storage_class: str = "") -> ObjectRecord:
        """A new, empty, unfinalized generation (replacing any live one); writer epoch 1."""
        validate_object_name(name)
        with self._transaction() as txn:
            target = self._bucket(bucket)
            if not target.zonal:
                raise FailedPrecondition(
                    f"bucket {bucket!r} is not a zonal bucket; appendable objects need a zonal (Rapid) bucket")
            check_folder_limits(name)
            replaced = self._live(bucket, name)
            preconditions.check(replaced)
            blob_id = self._new_blob(txn)
            now = self._now()
            record = ObjectRecord(bucket, name, blob_id, 1, 0, 0, None, False, now, now, None,
                                  content_type, storage_class or target.storage_class, 0,
                                  dict(metadata or {}), 1, blob_id)
            self._place_object(txn, target, record, replaced)
            return record

    def open_appendable(self, bucket: str, name: str, generation: int, *,
                        writer_epoch: int | None = None,
                        preconditions: Preconditions = NO_PRECONDITIONS) -> ObjectRecord:
        """Attach a writer to an unfinalized generation.

        Without ``writer_epoch`` this is a takeover: preconditions are checked
        and the epoch is bumped, fencing the previous writer. With the epoch
        from a write handle it is a resume by the current writer; an older
        epoch is stale.
        """
        with self._transaction():
            record = self._appendable(bucket, name, generation)
            if writer_epoch is None:
                preconditions.check(record)
                record = replace(record, writer_epoch=record.writer_epoch + 1)
                self._db.execute("UPDATE objects SET writer_epoch = ? WHERE bucket = ? AND name = ?",
                                 (record.writer_epoch, bucket, name))
            elif writer_epoch != record.writer_epoch:
                raise FailedPrecondition(
                    "stale write handle: a different writer has become the exclusive writer of this object")
            return record

    def _appendable(self, bucket: str, name: str, generation: int) -> ObjectRecord:
        self._bucket(bucket)
        record = self._live(bucket, name)
        if record is None or record.generation != generation:
            raise NotFound(f"generation {generation} of object {name!r} does not exist in bucket {bucket!r}")
        if record.finalized:
            raise FailedPrecondition(f"object {name!r} is finalized; it can no longer be appended to")
        return record

    def _writer(self, bucket: str, name: str, generation: int, writer_epoch: int) -> ObjectRecord:
        record = self._appendable(bucket, name, generation)
        if record.writer_epoch != writer_epoch:
            raise FailedPrecondition(
                "a different writer has become the exclusive writer of this object (takeover)")
        return record

    def writer_state(self, bucket: str, name: str, generation: int, writer_epoch: int) -> ObjectRecord:
        """The object as seen by its writer; fails if that writer was fenced."""
        with self._lock:
            return self._writer(bucket, name, generation, writer_epoch)

    def append(self, bucket: str, name: str, generation: int, writer_epoch: int,
               offset: int, data: bytes, crc32c: int | None = None) -> ObjectRecord:
        """Persist ``data`` written at ``offset``; bytes below the persisted size are skipped.
        ``crc32c``: the already verified checksum of ``data``, if known."""
        with self._transaction():
            record = self._writer(bucket, name, generation, writer_epoch)
            given = len(data)
            data = bytes_beyond(offset, record.size, data)
            if not data:
                return record
            self.blobs.append(record.blob_id, data, crc32c if len(data) == given else None)
            record = replace(record, size=record.size + len(data),
                             crc32c=google_crc32c.extend(record.crc32c, data), update_time=self._now())
            self._db.execute("UPDATE objects SET size = ?, crc32c = ?, update_time = ?, resource = ? "
                             "WHERE bucket = ? AND name = ?",
                             (record.size, record.crc32c, record.update_time, object_bytes(record),
                              bucket, name))
            return record

    def sync(self, record: ObjectRecord) -> None:
        """Make the object's bytes (and the index) durable: a flush. May block on fsync."""
        if not self.blobs.durable:
            return
        self.blobs.sync(record.blob_id)
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def finalize(self, bucket: str, name: str, generation: int, writer_epoch: int, *,
                 expected_crc32c: int | None = None, expected_md5: bytes | None = None) -> ObjectRecord:
        """Seal the object. Slow parts (MD5, fsync) run outside the lock: only
        this writer can grow the object, so its first ``size`` bytes are fixed."""
        record = self.writer_state(bucket, name, generation, writer_epoch)
        if expected_crc32c is not None and expected_crc32c != record.crc32c:
            raise InvalidArgument(
                f"object_checksums.crc32c {expected_crc32c} does not match the crc32c of the "
                f"{record.size} bytes persisted ({record.crc32c})")
        md5 = None
        if expected_md5:
            md5 = md5_of(self.blobs, record.blob_id, record.size)
            if md5 != expected_md5:
                raise InvalidArgument("object_checksums.md5_hash does not match the data persisted")
        self.blobs.sync(record.blob_id)
        with self._transaction() as txn:
            if self._writer(bucket, name, generation, writer_epoch).size != record.size:
                raise FailedPrecondition("the object grew while it was being finalized")
            now = self._now()
            record = replace(record, finalized=True, finalize_time=now, update_time=now, md5=md5)
            self._write_object(record)
            txn.on_commit.append(lambda: self.blobs.release(record.blob_id))
            return record
