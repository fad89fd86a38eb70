"""A read's bytes left as views of the blocks that hold them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: A read over more blocks than this is joined: a reply is one writev, which
#: takes at most 1024 pieces (IOV_MAX), and so many small views gain little.
MAX_PARTS = 64


@dataclass(frozen=True, slots=True)
class Gathered:
    """A read's bytes left in the blocks that hold them, in order: the reply
    gathers them (one ``writev``), so a READ larger than a block costs no join."""

    parts: tuple[memoryview, ...]

    def __len__(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


def slices(parts: Sequence[Any], start: int, stop: int) -> Gathered:
    """Bytes ``start:stop`` of ``parts`` laid end to end, as views of the parts."""
    views = []
    at = 0
    for part in parts:
        view = memoryview(part)
        begin, end = max(start - at, 0), min(stop - at, view.nbytes)
        if begin < end:
            views.append(view[begin:end])
        at += view.nbytes
    return Gathered(tuple(views))


def pieces(data: object) -> tuple[Any, ...]:
    """Bytes as ``writev`` pieces."""
    return data.parts if isinstance(data, Gathered) else (data,)


class Arriving:
    """Bytes on their way into memory (a WRITE's, still in a pipe); ``land``
    brings them in and returns them."""

    __slots__ = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def land(self) -> memoryview:
        raise NotImplementedError


def landed(data: bytes | memoryview | Arriving) -> bytes | memoryview:
    """``data``'s bytes, in memory; EIO (an OSError) when they cannot all be had."""
    return data.land() if isinstance(data, Arriving) else data
