"""What the FUSE process and a worker say to each other over their socket.

Every message is a small tuple, framed as a 4-byte length, a 1-byte codec
and the body; bytes of reads, batch reads and appends travel through the
shared-memory arena, not here (except bytes the arena had no room for).

The FUSE process sends ``(call_id, op, args)``; the worker answers
``(call_id, OK, result)`` or ``(call_id, FAILED, error)``, in any order.
Messages with ``call_id`` 0 are notices, unasked: ``(0, kind, payload)``.

Descriptors never travel as numbers or ``/proc`` paths: the FUSE process
passes each one over a second socket pair, the descriptor socket, with
``SCM_RIGHTS`` (``socket.send_fds``), under an 8-byte tag. A call that
passes one is ``(call_id, op, args, PASSES_DESCRIPTOR)`` and its tag is its
call id; the mount's ``/dev/fuse`` goes under :data:`FUSE_DEVICE`.

The codec is ``marshal`` for messages of plain values (ints, strings, bytes,
tuples, lists, dicts, None: every read and append answer), and ``pickle``
for the rest (object metadata, errors, settings). ``pickle.dumps`` starts
each message in a 4 KiB buffer from malloc and shrinks it in place: one
such message per answer left a small live block in the middle of freed
memory each time, and a busy worker's heap fragmented without bound.
``marshal`` grows its buffer from 50 bytes inside Python's own small-object
allocator, so answers never reach malloc.

:class:`FrameReader` is the framing alone, without I/O: feed it bytes, take
out the messages.
"""

from __future__ import annotations

import marshal
import pickle
import struct
from typing import Any

__all__ = ["DESCRIPTOR_TAG", "FAILED", "FILL", "FRAME_HEADER", "FUSE_DEVICE", "FrameReader", "MAX_FRAME", "NOTICE",
           "OK", "PASSES_DESCRIPTOR", "WRITE_PIPE_TAGS", "encode"]

OK = 0
FAILED = 1
#: A record on a worker's fill socket: a WRITE whose bytes wait in a pipe
#: (pipe id, size, arena offset, the WRITE's unique), one per SEQPACKET message.
FILL = struct.Struct("<IIQQ")
NOTICE = 0  # the call_id of a notice
#: The count a worker answers for a block read ahead whose bytes went only to
#: the kernel's page cache (``read_blocks``), or that it no longer holds (``copy_held``).
IN_KERNEL_ONLY = -1
#: The count a worker answers for ``copy_held`` when it answered the READ from
#: the bytes it holds for the store, which stay there: nothing is copied into the arena.
REPLIED_FROM_HELD = -2
#: The fourth element of a call whose descriptor comes on the descriptor socket.
PASSES_DESCRIPTOR = True

#: What goes with each descriptor on the descriptor socket: its tag.
DESCRIPTOR_TAG = struct.Struct("<Q")
#: The tag of the mount's /dev/fuse descriptor (call ids start at 1).
FUSE_DEVICE = 0
#: Tags from here on: the read end of WRITE pipe ``tag - WRITE_PIPE_TAGS``,
#: made after the worker started (far above any call id).
WRITE_PIPE_TAGS = 1 << 62

#: A frame larger than this is a broken peer (bytes that found the arena full are one read's or one batch's).
MAX_FRAME = 1 << 30

_HEADER = struct.Struct("<IB")  # the body's length, its codec
#: Bytes before a frame's body; its first four are the body's length.
FRAME_HEADER = _HEADER.size
_MARSHAL, _PICKLE = 0, 1
_MARSHAL_VERSION = 4


#: A call, an answer or a notice: a tuple of plain values (what each op takes is its own).
Message = tuple[Any, ...]


def encode(message: Any) -> bytes:  # a Message, or anything pickle takes
    try:
        body, codec = marshal.dumps(message, _MARSHAL_VERSION), _MARSHAL
    except ValueError:  # an object marshal does not know: metadata, an error
        body, codec = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL), _PICKLE
    return _HEADER.pack(len(body), codec) + body


class FrameReader:
    """Splits a byte stream into messages."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        buffer = self._buffer
        buffer += data
        messages = []
        start = 0
        end = len(buffer)
        header = _HEADER.size
        while end - start >= header:
            length, codec = _HEADER.unpack_from(buffer, start)
            if length > MAX_FRAME or codec not in (_MARSHAL, _PICKLE):
                raise ValueError(f"frame of {length} bytes, codec {codec}")
            if end - start - header < length:
                break
            body = memoryview(buffer)[start + header:start + header + length]
            messages.append(marshal.loads(body) if codec == _MARSHAL else pickle.loads(body))
            body.release()
            start += header + length
        if start:
            del buffer[:start]
        return messages

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame."""
        return len(self._buffer)
