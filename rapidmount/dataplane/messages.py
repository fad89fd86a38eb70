"""What the FUSE process and a worker say to each other over their socket.

Every message is a length-prefixed pickle of a small tuple; bytes of reads
and appends travel through the shared-memory arena, not here (except small
whole-file reads and an append the arena had no room for).

The FUSE process sends ``(call_id, op, args)``; the worker answers
``(call_id, OK, result)`` or ``(call_id, FAILED, error)``, in any order.
Messages with ``call_id`` 0 are notices, unasked: ``(0, kind, payload)``.

:class:`FrameReader` is the framing alone, without I/O: feed it bytes, take
out the messages.
"""

from __future__ import annotations

import pickle
import struct

__all__ = ["FAILED", "FrameReader", "MAX_FRAME", "NOTICE", "OK", "encode"]

OK = 0
FAILED = 1
NOTICE = 0  # the call_id of a notice

#: A frame larger than this is a broken peer (whole small files are at most a few MiB each).
MAX_FRAME = 1 << 30

_LENGTH = struct.Struct("<I")


def encode(message: tuple) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


class FrameReader:
    """Splits a byte stream into messages."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple]:
        buffer = self._buffer
        buffer += data
        messages = []
        start = 0
        end = len(buffer)
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if length > MAX_FRAME:
                raise ValueError(f"frame of {length} bytes")
            if end - start - 4 < length:
                break
            messages.append(pickle.loads(memoryview(buffer)[start + 4:start + 4 + length]))
            start += 4 + length
        if start:
            del buffer[:start]
        return messages

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame."""
        return len(self._buffer)
