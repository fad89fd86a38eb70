"""Opaque read and write handles.

A read handle names a generation of one object; a write handle also
carries the writer epoch it was issued for, so a handle from before a
takeover is recognisably stale. Both are bound to the object by a checksum
of ``bucket/name``, so a handle cannot be replayed against another object.
"""

from __future__ import annotations

import struct

import google_crc32c

_READ_MAGIC = b"rmr1"
_WRITE_MAGIC = b"rmw1"
_READ = struct.Struct(">4sQI")    # magic, generation, object checksum
_WRITE = struct.Struct(">4sQQI")  # magic, generation, writer epoch, object checksum


class BadHandle(ValueError):
    """Bytes that are not a handle of this object."""


def _object_tag(bucket: str, name: str) -> int:
    tag: int = google_crc32c.value(f"{bucket}/{name}".encode("utf-8", "surrogatepass"))
    return tag


def read_handle(bucket: str, name: str, generation: int) -> bytes:
    return _READ.pack(_READ_MAGIC, generation, _object_tag(bucket, name))


def parse_read_handle(handle: bytes, bucket: str, name: str) -> int:
    """The generation the handle names."""
    if len(handle) != _READ.size:
        raise BadHandle("read_handle is not a handle issued by this service")
    fields: tuple[bytes, int, int] = _READ.unpack(handle)
    magic, generation, tag = fields
    if magic != _READ_MAGIC:
        raise BadHandle("read_handle is not a handle issued by this service")
    if tag != _object_tag(bucket, name):
        raise BadHandle(f"read_handle was issued for a different object than {name!r}")
    return generation


def write_handle(bucket: str, name: str, generation: int, writer_epoch: int) -> bytes:
    return _WRITE.pack(_WRITE_MAGIC, generation, writer_epoch, _object_tag(bucket, name))


def parse_write_handle(handle: bytes, bucket: str, name: str) -> tuple[int, int]:
    """``(generation, writer_epoch)`` of the handle."""
    if len(handle) != _WRITE.size:
        raise BadHandle("write_handle is not a handle issued by this service")
    fields: tuple[bytes, int, int, int] = _WRITE.unpack(handle)
    magic, generation, epoch, tag = fields
    if magic != _WRITE_MAGIC:
        raise BadHandle("write_handle is not a handle issued by this service")
    if tag != _object_tag(bucket, name):
        raise BadHandle(f"write_handle was issued for a different object than {name!r}")
    return generation, epoch
