"""Hand-encoded ``BidiReadObjectResponse`` messages carrying one data chunk.

Building the message with protobuf copies the 2 MiB payload into the
message and again into the serialized bytes; here header, payload and
trailer are joined once. The bytes are exactly what upb's
``SerializeToString`` gives for the same message (fields in number order,
defaults omitted); tests compare the two.

    BidiReadObjectResponse { object_data_ranges (6): ObjectRangeData {
        checksummed_data (1): { content (1): bytes, crc32c (2): fixed32 }
        read_range (2): { read_offset (1), read_length (2), read_id (3): int64 }
        range_end (3): bool } }
"""

from __future__ import annotations

import struct

_UINT64 = (1 << 64) - 1
_FIXED32 = struct.Struct("<I")
_TAG_RESPONSE_RANGES = b"\x32"   # field 6, length-delimited
_TAG_CHECKSUMMED_DATA = b"\x0a"  # field 1, length-delimited
_TAG_CONTENT = b"\x0a"           # field 1, length-delimited
_TAG_CRC32C = b"\x15"            # field 2, fixed32
_TAG_READ_RANGE = b"\x12"        # field 2, length-delimited
_RANGE_END = b"\x18\x01"         # field 3, varint 1


def _varint(value: int) -> bytes:
    value &= _UINT64  # negative int64 values are encoded as 10-byte two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _int_field(tag: int, value: int) -> bytes:
    return bytes((tag,)) + _varint(value) if value else b""


def encode_range_chunk(data: bytes, crc32c: int, read_offset: int, read_id: int, range_end: bool) -> bytes:
    """One serialized BidiReadObjectResponse with a single ObjectRangeData."""
    read_range = _int_field(0x08, read_offset) + _int_field(0x10, len(data)) + _int_field(0x18, read_id)
    content_header = _TAG_CONTENT + _varint(len(data)) if data else b""  # proto3 omits empty bytes
    checksummed_length = len(content_header) + len(data) + 5
    trailer = (_TAG_CRC32C + _FIXED32.pack(crc32c)
               + _TAG_READ_RANGE + _varint(len(read_range)) + read_range
               + (_RANGE_END if range_end else b""))
    range_data_length = 1 + len(_varint(checksummed_length)) + checksummed_length + len(trailer) - 5
    header = (_TAG_RESPONSE_RANGES + _varint(range_data_length)
              + _TAG_CHECKSUMMED_DATA + _varint(checksummed_length) + content_header)
    return b"".join((header, data, trailer))
