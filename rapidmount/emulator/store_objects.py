"""Reading live objects, and the changes that keep their bytes: delete, update, move."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from .blobs import BlobReader
from .store_errors import InvalidArgument, NotFound
from .store_index import OBJECT_COLUMNS, StoreIndex
from .store_names import check_folder_limits, validate_object_name
from .store_preconditions import NO_PRECONDITIONS, Preconditions
from .store_records import ObjectRecord


class ObjectAccess(StoreIndex):
    """Object reads and metadata changes of ``Store``."""

    # ------------------------------------------------------------ reading

    def get_object(self, bucket: str, name: str, generation: int = 0,
                   preconditions: Preconditions = NO_PRECONDITIONS) -> ObjectRecord:
        return self.get_object_resource(bucket, name, generation, preconditions)[0]

    def get_object_resource(self, bucket: str, name: str, generation: int = 0,
                            preconditions: Preconditions = NO_PRECONDITIONS) -> tuple[ObjectRecord, bytes]:
        """The live object and its serialized ``Object`` resource."""
        with self._lock:
            self._bucket(bucket)
            row = self._db.execute(f"SELECT {OBJECT_COLUMNS}, resource FROM objects "
                                   "WHERE bucket = ? AND name = ?", (bucket, name)).fetchone()
            record = self._row_to_object(bucket, row[:-1]) if row else None
            if record is None or (generation and record.generation != generation):
                what = f"generation {generation} of " if generation else ""
                raise NotFound(f"{what}object {name!r} does not exist in bucket {bucket!r}")
            preconditions.check(record)
            resource: bytes = row[-1]
            return record, resource

    def find_object(self, bucket: str, name: str) -> ObjectRecord | None:
        with self._lock:
            self._bucket(bucket)
            return self._live(bucket, name)

    def open_reader(self, bucket: str, name: str, generation: int = 0,
                    preconditions: Preconditions = NO_PRECONDITIONS) -> tuple[ObjectRecord, BlobReader]:
        """The object plus a reader of its bytes that outlives deletes and overwrites."""
        record, _, reader = self.open_reader_resource(bucket, name, generation, preconditions)
        return record, reader

    def open_reader_resource(self, bucket: str, name: str, generation: int = 0,
                             preconditions: Preconditions = NO_PRECONDITIONS
                             ) -> tuple[ObjectRecord, bytes, BlobReader]:
        """``open_reader`` plus the object's serialized resource."""
        with self._lock:
            record, resource = self.get_object_resource(bucket, name, generation, preconditions)
            return record, resource, self.blobs.open_reader(record.blob_id)

    def read_all(self, bucket: str, name: str) -> bytes:
        with self._lock:
            record = self.get_object(bucket, name)
            return self.blobs.read(record.blob_id, 0, record.size)

    # ------------------------------------------------------------ object metadata

    def delete_object(self, bucket: str, name: str, generation: int = 0,
                      preconditions: Preconditions = NO_PRECONDITIONS) -> None:
        with self._transaction() as txn:
            record = self.get_object(bucket, name, generation, preconditions)
            self._db.execute("DELETE FROM objects WHERE bucket = ? AND name = ?", (bucket, name))
            txn.on_commit.append(lambda: self.blobs.delete(record.blob_id))

    def update_object(self, bucket: str, name: str, generation: int = 0,
                      preconditions: Preconditions = NO_PRECONDITIONS, *,
                      metadata: Mapping[str, str] | None = None,
                      metadata_patch: Mapping[str, str | None] | None = None,
                      content_type: str | None = None) -> ObjectRecord:
        """Replace the given fields (None = keep), then apply ``metadata_patch``
        (a None value removes the key); bumps the metageneration."""
        with self._transaction():
            record = self.get_object(bucket, name, generation, preconditions)
            new_metadata = dict(metadata) if metadata is not None else dict(record.metadata)
            for key, value in (metadata_patch or {}).items():
                if value is None:
                    new_metadata.pop(key, None)
                else:
                    new_metadata[key] = value
            record = replace(
                record, metageneration=record.metageneration + 1, update_time=self._now(),
                metadata=new_metadata,
                content_type=content_type if content_type is not None else record.content_type)
            self._write_object(record)
            return record

    def move_object(self, bucket: str, source: str, destination: str, *,
                    source_preconditions: Preconditions = NO_PRECONDITIONS,
                    destination_preconditions: Preconditions = NO_PRECONDITIONS) -> ObjectRecord:
        """Atomic rename within a bucket; the bytes stay, the destination gets a new generation."""
        validate_object_name(destination)
        if source == destination:
            raise InvalidArgument("source and destination objects must differ")
        with self._transaction() as txn:
            target = self._bucket(bucket)
            check_folder_limits(destination)
            record = self.get_object(bucket, source, 0, source_preconditions)
            replaced = self._live(bucket, destination)
            destination_preconditions.check(replaced)
            self._db.execute("DELETE FROM objects WHERE bucket = ? AND name = ?", (bucket, source))
            now = self._now()
            moved = replace(record, name=destination, generation=self._next_generation(),
                            metageneration=1, update_time=now, create_time=now, writer_epoch=1)
            self._place_object(txn, target, moved, replaced)
            return moved
