"""How a reader spreads its ranges over several streams, without I/O.

One stream of the service tops out near 1.2 GB/s, so a busy file handle
spreads its ranges over up to ``max_streams`` streams of the same object
generation, as Google's clients do. The first stream opens at the first
read: a handle that reads one range (a small file, a random 4 KiB read)
never has a second stream. Another opens only when a new range arrives and
every open stream is loaded, with ``max_ranges`` ranges or ``max_bytes``
bytes in flight, and only for a range that starts at least ``span`` bytes
per open stream into the object: a file of a few readahead windows (a
16 MiB shard) is read whole, in order, on one stream, as gcsfuse keeps one
per file under 100 MiB. A stream's open costs a round trip and the work of
a call on both ends, and the streams of one reader deliver their ranges
interleaved, which a reader of a short file only waits for.
"""

from __future__ import annotations

from collections.abc import Sequence

MiB = 1 << 20

#: A stream with this many ranges in flight is loaded.
DEFAULT_MAX_RANGES = 2
#: A stream with this many bytes in flight is loaded (four 2 MiB blocks).
DEFAULT_MAX_BYTES = 8 * MiB
#: Stream ``k`` (from 0) opens only for a range at least ``k`` times this far into the object.
DEFAULT_SPAN = 32 * MiB


class StreamPolicy:
    """Where a new range goes, given the load of each open stream.

    A stream's load is ``(ranges in flight, bytes in flight)``. The least
    loaded stream (fewest bytes, then fewest ranges, then the oldest) takes
    the range, unless it is loaded itself (``max_ranges`` ranges or
    ``max_bytes`` bytes in flight), fewer than ``max_streams`` streams
    exist and the range starts at least ``span`` bytes per open stream into
    the object: then a new stream is opened for it. A range of a stream that
    failed leaves its load, so the stream takes ranges again (and retries).
    """

    __slots__ = ("max_streams", "max_ranges", "max_bytes", "span")

    def __init__(self, max_streams: int, *, max_ranges: int = DEFAULT_MAX_RANGES,
                 max_bytes: int = DEFAULT_MAX_BYTES, span: int = DEFAULT_SPAN) -> None:
        if max_streams < 1 or max_ranges < 1 or max_bytes < 1 or span < 0:
            raise ValueError("max_streams, max_ranges and max_bytes must be positive, span not negative")
        self.max_streams = max_streams
        self.max_ranges = max_ranges
        self.max_bytes = max_bytes
        self.span = span

    def loaded(self, ranges: int, nbytes: int) -> bool:
        return ranges >= self.max_ranges or nbytes >= self.max_bytes

    def choose(self, loads: Sequence[tuple[int, int]], offset: int = 0) -> int:
        """The index of the stream for a new range at ``offset``; ``len(loads)``
        means: open a new one.

        With no stream at all, the answer is 0 (the first).
        """
        if not loads:
            return 0
        best = self.least_loaded(loads)
        if len(loads) < self.max_streams and offset >= len(loads) * self.span and self.loaded(*loads[best]):
            return len(loads)
        return best

    @staticmethod
    def least_loaded(loads: Sequence[tuple[int, int]]) -> int:
        """Fewest bytes in flight, then fewest ranges, then the oldest stream."""
        return min(range(len(loads)), key=lambda i: (loads[i][1], loads[i][0], i))
