"""How a reader spreads its ranges over several streams, without I/O.

One stream of the service tops out near 1.2 GB/s, so a busy file handle
spreads its ranges over up to ``max_streams`` streams of the same object
generation, as Google's clients do. The first stream opens at the first
read: a handle that reads one range (a small file, a random 4 KiB read)
never has a second stream. Another opens only when a new range arrives and
every open stream is loaded, with ``max_ranges`` ranges or ``max_bytes``
bytes in flight.
"""

from __future__ import annotations

from collections.abc import Sequence

MiB = 1 << 20

#: A stream with this many ranges in flight is loaded.
DEFAULT_MAX_RANGES = 2
#: A stream with this many bytes in flight is loaded (four 2 MiB blocks).
DEFAULT_MAX_BYTES = 8 * MiB


class StreamPolicy:
    """Where a new range goes, given the load of each open stream.

    A stream's load is ``(ranges in flight, bytes in flight)``. The least
    loaded stream (fewest bytes, then fewest ranges, then the oldest) takes
    the range, unless it is loaded itself (``max_ranges`` ranges or
    ``max_bytes`` bytes in flight) and fewer than ``max_streams`` streams
    exist: then a new stream is opened for it. A range of a stream that
    failed leaves its load, so the stream takes ranges again (and retries).
    """

    __slots__ = ("max_streams", "max_ranges", "max_bytes")

    def __init__(self, max_streams: int, *, max_ranges: int = DEFAULT_MAX_RANGES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_streams < 1 or max_ranges < 1 or max_bytes < 1:
            raise ValueError("max_streams, max_ranges and max_bytes must be positive")
        self.max_streams = max_streams
        self.max_ranges = max_ranges
        self.max_bytes = max_bytes

    def loaded(self, ranges: int, nbytes: int) -> bool:
        return ranges >= self.max_ranges or nbytes >= self.max_bytes

    def choose(self, loads: Sequence[tuple[int, int]]) -> int:
        """The index of the stream for a new range; ``len(loads)`` means: open a new one.

        With no stream at all, the answer is 0 (the first).
        """
        if not loads:
            return 0
        best = self.least_loaded(loads)
        if len(loads) < self.max_streams and self.loaded(*loads[best]):
            return len(loads)
        return best

    @staticmethod
    def least_loaded(loads: Sequence[tuple[int, int]]) -> int:
        """Fewest bytes in flight, then fewest ranges, then the oldest stream."""
        return min(range(len(loads)), key=lambda i: (loads[i][1], loads[i][0], i))
