"""The pieces an appender gathers appended bytes into before a worker sends
them, and their sizes: bytes copied into the arena (:class:`_Piece`), written
bytes held where they are (:class:`_HeldPiece`, :class:`_ArenaHeldPiece`),
and a part of a staged file (:class:`_StagedPart`). The appender keeps each
until the bucket confirmed its bytes.
"""

from __future__ import annotations

import os
from typing import cast

from rapidmount.dataplane.store_base import WorkerStoreBase
from rapidmount.shared import wire
from rapidmount.shared.arena import Arena
from rapidmount.shared.peer_memory import address_of

#: Appends go to a worker in pieces of one message of the append stream: a
#: worker then sends each piece as it came, with no copy to join smaller ones.
APPEND_PIECE = wire.MAX_CHUNK_BYTES

#: Bytes held where they were written (no copy to make) go to a worker in
#: pieces of up to this much, at most a quarter of --write-buffer: one call
#: and one answer per 8 MiB, not per message of the stream. The worker's
#: writer cuts them into messages as it sends.
HELD_APPEND_PIECE = 4 * APPEND_PIECE

#: Writes at least this large are appended from their own ``bytes``, kept
#: here and read by the worker from this process's memory; smaller ones are
#: copied into the arena. Copying 64 KiB takes a few microseconds, less than
#: the rest of a write's way through this process, while each write kept is
#: an allocation held until confirmed and a segment in the worker's message:
#: below this, keeping thousands of small objects costs more than the copy.
#: An 8 MiB piece is then at most 129 segments (the tail of a split write, then 128).
PEER_WRITE_MIN = 64 << 10


class _Piece:
    """The piece of appended bytes being filled: an arena region, or memory when the arena is full."""

    __slots__ = ("arena_offset", "buffer", "filled", "start")

    def __init__(self, store: WorkerStoreBase, start: int) -> None:
        region = store.arena.allocate(APPEND_PIECE)
        self.arena_offset: int | None
        self.buffer: memoryview | bytearray
        self.arena_offset, self.buffer = (None, bytearray(APPEND_PIECE)) if region is None else region
        self.filled = 0
        self.start = start  # its offset in the file

    def add(self, data: bytes | memoryview, offset: int, length: int) -> None:
        self.buffer[self.filled:self.filled + length] = memoryview(data)[offset:offset + length]
        self.filled += length


class _HeldPiece:
    """A piece of appended bytes left where they are: parts of written
    ``bytes`` objects, kept alive here, which the worker reads from this
    process's memory."""

    __slots__ = ("parts", "filled", "start")

    def __init__(self, start: int) -> None:
        self.parts: list[tuple[bytes | memoryview, int, int]] = []  # (a write's bytes, offset in them, length)
        self.filled = 0
        self.start = start  # its offset in the file

    def __len__(self) -> int:
        return self.filled

    def add(self, data: bytes | memoryview, offset: int, length: int) -> None:
        self.parts.append((data, offset, length))
        self.filled += length

    def _from(self, skip: int) -> list[tuple[bytes | memoryview, int, int]]:
        """The parts of the piece's bytes from ``skip`` on."""
        kept = []
        for data, offset, length in self.parts:
            if skip >= length:
                skip -= length
                continue
            kept.append((data, offset + skip, length - skip))
            skip = 0
        return kept

    def segments(self, skip: int = 0) -> list[tuple[int, int]]:
        """Where the bytes from ``skip`` on are in this process: (address, length)."""
        return [(address_of(cast(bytes, data)) + offset, length) for data, offset, length in self._from(skip)]

    def joined(self, skip: int = 0) -> bytes:
        """The bytes from ``skip`` on, copied (for a worker that cannot read them here)."""
        return b"".join(memoryview(data)[offset:offset + length] for data, offset, length in self._from(skip))


class _ArenaHeldPiece(_HeldPiece):
    """A piece of appended bytes the kernel wrote into the arena (the
    request loop reads a large WRITE there): views of it, kept alive here,
    which the worker reads through its own mapping."""

    __slots__ = ()

    def arena_segments(self, arena: Arena, skip: int = 0) -> list[tuple[int, int]]:
        """Where the bytes from ``skip`` on are in the arena: (offset, length)."""
        segments = []
        for view, offset, length in self._from(skip):
            start = arena.offset_of(view)
            assert start is not None  # only arena views are held here
            segments.append((start + offset, length))
        return segments


class _StagedPart:
    """Bytes appended from a staged file: its first ``length`` bytes, through a
    duplicate of its descriptor, kept until the bucket confirmed them."""

    __slots__ = ("fd", "length")

    def __init__(self, source: int, length: int) -> None:
        self.fd = os.dup(source)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def close(self) -> None:
        os.close(self.fd)
