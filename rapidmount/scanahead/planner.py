"""Predict which files a process is about to open (sans-I/O).

ML data loaders open many small files one after the other. Two orders are
predictable:

- **listing order**: files of one directory opened in the (sorted) order
  ``readdir`` returns them, as a loader without shuffling does;
- **replayed order**: the same sequence of files opened again, as the next
  epoch over a fixed file list does, whatever that order is.

A :class:`ScanTracker` watches one scan of such a sequence. Readers sharing
a queue (threads) interleave their opens, so a position within ``slack`` of
the furthest one seen still counts as in order; two such opens in a row and
the tracker asks for the next ``depth`` positions, then tops the window up
in batches. The caller may name a scan's batch: large files (each prefetch
a whole block) start a few ahead and go one at a time, so no file's read
shares the machine with a burst of prefetches. A jump elsewhere resets it,
so random access never triggers
prefetching. :class:`ScanStreams` follows several scans of one sequence at
once (loader workers each reading their own batch of consecutive files);
a new scan needs three in-order opens before it is trusted.

:class:`ScanPlanner` keeps one tracker per recently used directory and one
over the history of opens, and turns their answers into paths to prefetch.
It does no I/O: the filesystem core fetches what it returns.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["ScanPlanner", "ScanTracker"]


class ScanTracker:
    """Detects a forward scan over one sequence and plans how far to run ahead."""

    __slots__ = ("depth", "slack", "trigger", "batch", "frontier", "ahead", "score", "reach")

    def __init__(self, depth: int, *, slack: int = 32, trigger: int = 2) -> None:
        if depth <= 0 or slack < 0 or trigger <= 0:
            raise ValueError("depth and trigger must be > 0 and slack >= 0")
        self.depth = depth
        self.slack = slack
        self.trigger = trigger
        self.batch = max(1, depth // 4)
        self.frontier = -1  # furthest position opened in the current scan
        self.ahead = 0      # positions below this were already planned
        self.score = 0      # in-order opens in a row
        self.reach = 0      # how far ahead the current scan runs (0: not trusted yet)

    def follows(self, position: int) -> bool:
        """Whether an open at ``position`` continues this scan."""
        return (self.frontier >= 0
                and self.frontier - self.slack <= position <= max(self.frontier + 1, self.ahead) + self.slack)

    def observe(self, position: int, batch: int | None = None) -> range:
        """Note an open at ``position``; return the positions to fetch now.

        ``batch``: the top-up of this scan's opens. By default a quarter of
        ``depth``, with the whole ``depth`` planned once the scan is trusted.
        Given (large files), the scan starts ``4 * batch`` ahead and runs a
        batch further at each top-up until ``depth``: a burst of prefetches
        shares the machine with the read of the file just opened."""
        if self.follows(position):
            self.score += 1
            self.frontier = max(self.frontier, position)
        else:
            self.score = 0
            self.frontier = position
            self.ahead = position + 1
            self.reach = 0
        if self.score < self.trigger:
            return range(0)
        step = self.batch if batch is None else max(1, batch)
        grow = 0 if batch is None else step
        start = max(self.ahead, self.frontier + 1)
        if not self.reach:
            self.reach = self.depth if batch is None else min(self.depth, 4 * step)
            end = self.frontier + 1 + self.reach
        else:
            end = self.frontier + 1 + min(self.depth, self.reach + grow)
            if end - start < step:
                # Top the window up in batches: fewer, larger fetches.
                return range(0)
            self.reach = end - self.frontier - 1
        self.ahead = end
        return range(start, end)


class ScanStreams:
    """Several scans of one sequence at once, e.g. one per data-loader worker.

    Each open continues the scan it follows, or starts a new one (the least
    recently used is dropped past ``streams``), so one reader jumping ahead
    does not reset the others.
    """

    __slots__ = ("depth", "slack", "streams", "trigger", "_scans")

    def __init__(self, depth: int, *, slack: int = 16, streams: int = 16, trigger: int = 3) -> None:
        self.depth = depth
        self.slack = slack
        self.streams = streams
        self.trigger = trigger
        self._scans: list[ScanTracker] = []  # most recently used last

    def observe(self, position: int, batch: int | None = None) -> range:
        for index in range(len(self._scans) - 1, -1, -1):
            scan = self._scans[index]
            if scan.follows(position):
                if index != len(self._scans) - 1:
                    self._scans.append(self._scans.pop(index))
                return scan.observe(position, batch)
        scan = ScanTracker(self.depth, slack=self.slack, trigger=self.trigger)
        self._scans.append(scan)
        if len(self._scans) > self.streams:
            self._scans.pop(0)
        return scan.observe(position, batch)


class ScanPlanner:
    """Paths worth prefetching after each open, from listing and replay order.

    ``directories`` bounds how many directories keep a tracker and
    ``history`` how many past opens are remembered for replay detection.
    """

    def __init__(self, depth: int, *, slack: int = 16, directories: int = 256,
                 history: int = 65536) -> None:
        self.depth = depth
        self.slack = slack
        self.max_directories = directories
        self.max_history = history
        self._directories: OrderedDict[str, tuple[ScanStreams, Sequence[str]]] = OrderedDict()
        # Replay: the order of past opens, as a sliding window of positions.
        self._history: dict[int, str] = {}
        self._position_of: dict[str, int] = {}
        self._next_position = 0
        self._replay = ScanStreams(depth, slack=slack)
        self.planned = 0

    def opened(self, directory: str, name: str, listing: Sequence[str] | None,
               batch: int | None = None) -> list[str]:
        """Record that ``directory + name`` was opened; return paths to prefetch.

        ``listing`` is the directory's file names in sorted order when known
        (a cached readdir). Returned paths are full object paths, nearest first.
        ``batch``: see :meth:`ScanTracker.observe`.
        """
        path = directory + name
        wanted: dict[str, None] = {}
        if listing is not None:
            for position in self._observe_listing(directory, name, listing, batch):
                wanted[directory + listing[position]] = None
        for position in self._observe_replay(path, batch):
            wanted[self._history[position]] = None
        wanted.pop(path, None)
        self.planned += len(wanted)
        return list(wanted)

    def _observe_listing(self, directory: str, name: str, listing: Sequence[str], batch: int | None) -> range:
        state = self._directories.get(directory)
        if state is None or state[1] is not listing:
            # A small directory gets less slack and fewer scans, or random
            # opens would look ordered.
            slack = min(self.slack, max(2, len(listing) // 32))
            streams = max(1, min(16, len(listing) // 256))
            state = (ScanStreams(self.depth, slack=slack, streams=streams), listing)
            self._directories[directory] = state
            while len(self._directories) > self.max_directories:
                self._directories.popitem(last=False)
        else:
            self._directories.move_to_end(directory)
        tracker = state[0]
        # Listings are sorted: a binary search, no index to keep in memory.
        position = bisect_left(listing, name)
        if position == len(listing) or listing[position] != name:
            return range(0)
        planned = tracker.observe(position, batch)
        return range(planned.start, min(planned.stop, len(listing)))

    def _observe_replay(self, path: str, batch: int | None) -> range:
        previous = self._position_of.get(path)
        position = self._next_position
        self._next_position += 1
        self._history[position] = path
        self._position_of[path] = position
        expired = position - self.max_history
        if expired >= 0:
            old = self._history.pop(expired, None)
            if old is not None and self._position_of.get(old) == expired:
                del self._position_of[old]
        if previous is None:
            return range(0)
        planned = self._replay.observe(previous, batch)
        # Only positions of the previous pass that are still remembered.
        return range(max(planned.start, position - self.max_history + 1), min(planned.stop, position))
