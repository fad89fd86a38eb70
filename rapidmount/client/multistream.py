"""Several BidiReadObject streams for one open file handle, added by load.

One stream of the service tops out near 1.2 GB/s, so a busy handle spreads
its ranges over up to ``max_streams`` streams of the same object
generation, as Google's clients do. The first stream opens at the first
read, exactly as a lone :class:`~rapidmount.client.reader.BidiObjectReader`
would: a handle that reads one range (a small file fetched whole at open, a
random 4 KiB read) never has a second stream. Another stream opens only when
a new range arrives and every open stream is loaded, with
``max_ranges`` ranges or ``max_bytes`` bytes in flight. It opens with the
first stream's read handle (and routing token), so the service skips the
object's lookup, and with its generation pinned; until the service has
answered the first stream (one round trip), a range that would open another
stream waits for that handle.

Each stream is a full ``BidiObjectReader``: it keeps its own redirects,
resumption, CRC32C checks and retries, and an error on one stream fails
only the ranges it carries. :class:`StreamPolicy` is the choice alone,
without I/O.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence

from rapidmount.client.errors import RetryPolicy, StorageError
from rapidmount.client.reader import BidiObjectReader
from rapidmount.client.storage import StorageClient

MiB = 1 << 20

#: A stream with this many ranges in flight is loaded.
DEFAULT_MAX_RANGES = 2
#: A stream with this many bytes in flight is loaded (four 2 MiB blocks).
DEFAULT_MAX_BYTES = 8 * MiB
#: While a new stream waits for the first stream's read handle, the load is looked at again this often.
HANDLE_WAIT_SECONDS = 0.05


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


class MultiStreamReader:
    """Reads ranges of one object generation over up to ``policy.max_streams`` streams.

    The same interface as :class:`BidiObjectReader` (``read``, ``close``,
    ``idle``, ``stream_open``); asyncio side, one event loop.
    """

    def __init__(self, client: StorageClient, name: str, generation: int, *,
                 retry: RetryPolicy, stall_timeout: float = 60.0,
                 on_event: Callable[[str], None] | None = None,
                 policy: StreamPolicy) -> None:
        self._client = client
        self.name = name
        self._retry = retry
        self._stall_timeout = stall_timeout
        self._on_event = on_event
        self.policy = policy
        self._streams: list[BidiObjectReader] = [self._new_stream(generation, None, None)]
        self._ranges: list[int] = [0]  # ranges in flight, per stream
        self._bytes: list[int] = [0]   # bytes requested in flight, per stream
        self._closed = False

    @property
    def generation(self) -> int:
        return self._streams[0].generation

    @property
    def streams(self) -> int:
        """How many streams this reader has made (opened or opening)."""
        return len(self._streams)

    @property
    def idle(self) -> bool:
        """True if no stream was ever opened (closing it needs no round trip)."""
        return self._streams[0].idle  # later streams exist only once the first one answered

    @property
    def stream_open(self) -> bool:
        return any(stream.stream_open for stream in self._streams)

    def loads(self) -> list[tuple[int, int]]:
        """``(ranges, bytes)`` in flight on each stream."""
        return list(zip(self._ranges, self._bytes))

    async def read(self, offset: int, length: int) -> bytes | memoryview:
        """Read ``length`` bytes at ``offset`` on the stream the policy picks."""
        if self._closed:
            raise StorageError("read on a closed stream", errno_=errno.EBADF)
        streams = self._streams
        if self.policy.max_streams == 1:
            return await streams[0].read(offset, length)
        first = streams[0]
        choose = self.policy.choose
        index = choose(self.loads())
        while index == len(streams) and not first.answered:
            # Another stream is due, but its read handle comes with the first
            # stream's first answer (one round trip). Wait for it, looking
            # again now and then: the load may drop meanwhile.
            await first.wait_answered(HANDLE_WAIT_SECONDS)
            if self._closed:
                raise StorageError("read on a closed stream", errno_=errno.EBADF)
            index = choose(self.loads())
        if index == len(streams) and first.read_handle is None and not first.stream_open:
            # The first stream failed before the service gave it a handle: a
            # second stream would fail the same way. The range goes where the
            # others are (and retries there).
            index = self.policy.least_loaded(self.loads())
        if index == len(streams):
            streams.append(self._new_stream(first.generation, first.read_handle, first.routing_token))
            self._ranges.append(0)
            self._bytes.append(0)
        self._ranges[index] += 1
        self._bytes[index] += length
        try:
            return await streams[index].read(offset, length)
        finally:
            self._ranges[index] -= 1
            self._bytes[index] -= length

    def _new_stream(self, generation: int, read_handle: bytes | None,
                    routing_token: str | None) -> BidiObjectReader:
        return BidiObjectReader(self._client, self.name, generation, retry=self._retry,
                                stall_timeout=self._stall_timeout, on_event=self._on_event,
                                read_handle=read_handle, routing_token=routing_token)

    async def close(self) -> None:
        """Close every stream (each fails its pending ranges with EBADF)."""
        self._closed = True
        for stream in self._streams:
            await stream.close()
