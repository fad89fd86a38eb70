"""The ``Object`` resource of a stored object, as a message and as bytes.

The store keeps every object's serialized resource next to its row
(``Store`` calls ``object_bytes`` whenever a row changes), so the hot
replies (``ListObjects`` pages, ``GetObject``, the ``BidiReadObject`` open)
are assembled from cached bytes instead of building protobuf messages: on
the wire a message field is ``tag, length, bytes`` and a repeated field is
the concatenation of its elements (see ``chunks``). Of the emulator this
module imports only the store's records, so the store can use it.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import timestamp_pb2

from rapidmount.shared import wire

from .store_records import ObjectRecord

S = wire.storage
_Timestamp = timestamp_pb2.Timestamp
_NANOS = 1_000_000_000


def timestamp(seconds: float) -> Any:
    """A Timestamp of ``seconds`` since the epoch, to the nanosecond below."""
    nanos = int(seconds * 1e9)
    return _Timestamp(seconds=nanos // _NANOS, nanos=nanos % _NANOS)


def object_message(record: ObjectRecord, size: int | None = None) -> Any:
    """The Object resource of an ``ObjectRecord``; ``size`` overrides the
    recorded size (live reads of a growing object)."""
    obj = S.Object(
        name=record.name,
        bucket=wire.bucket_resource(record.bucket),
        etag=f"{record.generation:x}.{record.metageneration}",
        generation=record.generation,
        metageneration=record.metageneration,
        storage_class=record.storage_class,
        size=record.size if size is None else size,
        content_type=record.content_type,
        component_count=record.component_count,
        create_time=timestamp(record.create_time),
        update_time=timestamp(record.update_time),
    )
    if record.metadata:
        obj.metadata.update(record.metadata)
    if record.finalized:
        obj.finalize_time.CopyFrom(timestamp(record.finalize_time or record.update_time))
        obj.checksums.crc32c = record.crc32c
        if record.md5:
            obj.checksums.md5_hash = record.md5
    return obj


def object_bytes(record: ObjectRecord) -> bytes:
    """``object_message(record)`` serialized."""
    serialized: bytes = object_message(record).SerializeToString()
    return serialized
