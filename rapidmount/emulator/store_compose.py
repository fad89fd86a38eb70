"""ComposeObject: a new object made of the bytes of finalized source objects."""

from __future__ import annotations

from typing import Mapping, Sequence

from rapidmount.storage.seam import COMPOSE_MAX_SOURCES

from .blob_digests import HASH_CHUNK
from .blobs import BlobReader
from .store_errors import FailedPrecondition, InvalidArgument
from .store_objects import ObjectAccess
from .store_preconditions import NO_PRECONDITIONS, Preconditions
from .store_records import ObjectRecord
from .store_uploads import Uploads


class Compose(ObjectAccess, Uploads):
    """``Store.compose``: reads the sources, stages their bytes, commits the result."""

    def compose(self, bucket: str, destination: str, sources: Sequence[tuple[str, int, int | None]],
                preconditions: Preconditions = NO_PRECONDITIONS, *,
                metadata: Mapping[str, str] | None = None, content_type: str = "",
                expected_crc32c: int | None = None) -> ObjectRecord:
        """Concatenate finalized ``(name, generation or 0, if_generation_match)`` sources."""
        if not sources:
            raise InvalidArgument("ComposeObject needs at least one source object")
        if len(sources) > COMPOSE_MAX_SOURCES:
            raise InvalidArgument(f"ComposeObject takes at most {COMPOSE_MAX_SOURCES} source objects")
        readers: list[BlobReader] = []
        try:
            with self._lock:  # snapshot the sources; copy them without holding the lock
                if self._bucket(bucket).zonal:
                    raise FailedPrecondition("ComposeObject is not supported on zonal (Rapid) buckets")
                records = []
                for name, generation, if_generation_match in sources:
                    record, reader = self.open_reader(bucket, name, generation,
                                                      Preconditions(if_generation_match=if_generation_match))
                    readers.append(reader)
                    if not record.finalized:
                        raise FailedPrecondition(f"source object {name!r} is not finalized")
                    records.append(record)
            blob_id = self.begin_upload()
            try:
                for record, reader in zip(records, readers):
                    for offset in range(0, record.size, HASH_CHUNK):
                        self.upload_append(blob_id, reader.read(offset, min(HASH_CHUNK, record.size - offset)))
            except BaseException:
                self.abort_upload(blob_id)
                raise
        finally:
            for reader in readers:
                reader.close()
        components = sum(max(1, record.component_count) for record in records)
        return self.commit_upload(blob_id, bucket, destination, preconditions, metadata=metadata,
                                  content_type=content_type, expected_crc32c=expected_crc32c,
                                  component_count=components)
