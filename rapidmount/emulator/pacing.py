"""A per-stream read bandwidth cap (``--stream-bandwidth``).

One BidiReadObject stream of the real service tops out near 1.2 GB/s, which
is why Google's clients open several streams per large object. This machine
serves one stream far faster than its share of that, so without a cap the
gain from more streams cannot be seen here. With a cap, every read stream
(BidiReadObject or ReadObject) is held to it on its own: N streams together
may move N times the cap. Ranges on one BidiReadObject stream share its cap.
Writes are never paced.

Each stream has a token bucket. Before a chunk goes out, its bytes are
charged; when the bucket runs dry the chunk waits (``asyncio.sleep``) until
the debt is repaid at the capped rate, so it leaves when its last byte would
have crossed a link of that rate. The bucket holds at most ``burst`` bytes:
10 ms of the cap, and never less than 64 KiB. So a stream never gets more
than one burst ahead of the cap: the chunks it sends within T seconds after
any chunk carry at most ``burst + cap * T`` bytes, whatever their size (up
to 2 MiB). A small read on a fresh or idle stream goes out at once: it is
charged its own length, not a chunk's. An uncapped emulator never enters
the bucket.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Protocol

from rapidmount.daemon.config import parse_size

MIN_BURST_BYTES = 64 << 10
BURST_SECONDS = 0.010


def burst_bytes(bytes_per_second: float) -> float:
    """How many bytes an idle stream may send at once under a cap."""
    return max(float(MIN_BURST_BYTES), bytes_per_second * BURST_SECONDS)


def check_bandwidth(value: float | None) -> float | None:
    """``value`` if it is a valid cap (a positive number of bytes per second), or None (no cap)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"stream bandwidth must be a number of bytes per second or None, not {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"stream bandwidth must be a positive, finite number of bytes per second "
                         f"(None turns the cap off), not {value}")
    return value


def parse_bandwidth(text: str) -> int | None:
    """``"100MiB"``, ``"100MB/s"``, ``"20000000"`` → bytes per second; ``"off"`` → None.

    Sizes follow the mount's syntax (``rapidmount.daemon.config.parse_size``): all
    units are binary, so ``MB`` means MiB. A trailing ``/s`` is allowed.
    """
    stripped = text.strip()
    if stripped.lower() == "off":
        return None
    if stripped.lower().endswith("/s"):
        stripped = stripped[:-2]
    value = parse_size(stripped)
    if value <= 0:
        raise ValueError(f"must be a positive number of bytes per second, or off: {text!r}")
    return value


class Bandwidth(Protocol):
    """Where the cap is read at each charge (the emulator's faults: it can change while a stream runs)."""

    @property
    def stream_bandwidth(self) -> float | None: ...


class StreamPacer:
    """The token bucket of one read stream.

    ``charge(count)`` is called before each chunk with the chunk's length and
    returns how long to wait before sending it (0.0 without a cap). The cap
    is read from ``faults.stream_bandwidth`` at every chunk, so a change at
    run time applies to open streams from their next chunk.
    """

    __slots__ = ("_faults", "_clock", "_tokens", "_stamp", "_rate")

    def __init__(self, faults: Bandwidth, clock: Callable[[], float] = time.monotonic) -> None:
        self._faults = faults
        self._clock = clock
        self._tokens: float | None = None  # None: full (the stream has sent nothing yet)
        self._stamp = 0.0
        self._rate = 0.0  # the cap of the last charge

    def charge(self, count: int) -> float:
        rate = self._faults.stream_bandwidth
        if rate is None or count <= 0:
            return 0.0
        return self._take(count, rate)

    def _take(self, count: int, rate: float) -> float:
        now = self._clock()
        burst = burst_bytes(rate)
        if self._tokens is None:
            tokens = burst
        else:
            # Refilled since the last charge at the rate then in force: a debt
            # left by the last chunk is repaid by the wait it was given (or by
            # more, if the wait overshot or the client was slow).
            tokens = min(burst, self._tokens + (now - self._stamp) * self._rate)
        tokens -= count
        self._tokens, self._stamp, self._rate = tokens, now, rate
        return -tokens / rate if tokens < 0 else 0.0
