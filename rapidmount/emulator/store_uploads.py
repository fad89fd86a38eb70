"""Whole-object writes: staged one-shot uploads committed as a new generation."""

from __future__ import annotations

from typing import Mapping

import google_crc32c

from .blob_digests import crc32c_of, md5_of
from .store_errors import FailedPrecondition, InvalidArgument
from .store_index import StoreIndex
from .store_names import check_folder_limits, validate_object_name
from .store_preconditions import NO_PRECONDITIONS, Preconditions
from .store_records import ObjectRecord


class Uploads(StoreIndex):
    """Staged uploads and the shortcuts built on them, of ``Store``."""

    def begin_upload(self) -> int:
        """A staging blob for a one-shot upload; invisible until ``commit_upload``."""
        with self._transaction() as txn:
            blob_id = self._new_blob(txn)
        return blob_id

    def upload_append(self, blob_id: int, data: bytes) -> None:
        self.blobs.append(blob_id, data)

    def abort_upload(self, blob_id: int) -> None:
        self.blobs.delete(blob_id)

    def commit_upload(self, blob_id: int, bucket: str, name: str,
                      preconditions: Preconditions = NO_PRECONDITIONS, *,
                      metadata: Mapping[str, str] | None = None, content_type: str = "",
                      storage_class: str = "", expected_crc32c: int | None = None,
                      expected_md5: bytes | None = None, component_count: int = 0,
                      finalize: bool = True) -> ObjectRecord:
        """Publish a staged blob as the live generation of ``name``.

        On failure the staged blob is deleted.
        """
        try:
            validate_object_name(name)
            size = self.blobs.size(blob_id)
            crc = crc32c_of(self.blobs, blob_id, size)
            if expected_crc32c is not None and expected_crc32c != crc:
                raise InvalidArgument(
                    f"object_checksums.crc32c {expected_crc32c} does not match the crc32c of the "
                    f"{size} bytes received ({crc})")
            # MD5 costs a full pass; only computed when the client sends one to check.
            md5 = md5_of(self.blobs, blob_id, size) if expected_md5 else None
            if expected_md5 and md5 != expected_md5:
                raise InvalidArgument("object_checksums.md5_hash does not match the data received")
            if finalize:
                self.blobs.sync(blob_id)
            with self._transaction() as txn:
                target = self._bucket(bucket)
                if not finalize and not target.zonal:
                    raise FailedPrecondition(f"bucket {bucket!r} is not zonal; objects there are always finalized")
                check_folder_limits(name)
                replaced = self._live(bucket, name)
                preconditions.check(replaced)
                now = self._now()
                record = ObjectRecord(bucket, name, self._next_generation(), 1, size, crc, md5, finalize,
                                      now, now, now if finalize else None, content_type,
                                      storage_class or target.storage_class, component_count,
                                      dict(metadata or {}), 1, blob_id)
                self._place_object(txn, target, record, replaced)
        except BaseException:
            self.blobs.delete(blob_id)
            raise
        if finalize:
            self.blobs.release(blob_id)
        return record

    def put_object(self, bucket: str, name: str, data: bytes,
                   preconditions: Preconditions = NO_PRECONDITIONS, *, finalize: bool = True,
                   metadata: Mapping[str, str] | None = None, content_type: str = "") -> ObjectRecord:
        blob_id = self.begin_upload()
        try:
            self.upload_append(blob_id, data)
        except BaseException:
            self.abort_upload(blob_id)
            raise
        return self.commit_upload(blob_id, bucket, name, preconditions, metadata=metadata,
                                  content_type=content_type, finalize=finalize)

    def put_many(self, bucket: str, objects: Mapping[str, bytes]) -> list[ObjectRecord]:
        """Many finalized objects in one transaction (fast test setup)."""
        for name in objects:
            validate_object_name(name)
            check_folder_limits(name)
        records = []
        with self._transaction() as txn:
            target = self._bucket(bucket)
            now = self._now()
            for name, data in objects.items():
                replaced = self._live(bucket, name)
                blob_id = self._new_blob(txn, [data])
                record = ObjectRecord(bucket, name, blob_id, 1, len(data), google_crc32c.value(bytes(data)),
                                      None, True, now, now, now, "",
                                      target.storage_class, 0, {}, 1, blob_id)
                self._place_object(txn, target, record, replaced)
                records.append(record)
        return records
