"""Per-handle readahead policy: classify each read and say what to fetch.

Pure and deterministic: :meth:`ReadaheadPolicy.plan` turns ``(offset, size,
file_size)`` into a :class:`ReadPlan`; the trio layer carries it out (cache
lookups, single-flight fetches, budget reservations).

Model (after gcsfuse's buffered reader and mountpoint-s3's prefetcher):

* **Sequential detection.** A read is *near* when it starts within
  ``sequential_slack`` bytes (either way) of the stream position: in
  sequential mode the furthest end reached by the current stream, in random
  mode the end of the previous read. The slack absorbs the kernel
  reordering/merging of its requests (at most 256 KiB back and 512 KiB
  forward for 1 MiB ones; one request of reordering is allowed) and several
  threads sharing a handle. The first read is
  sequential when it is near offset 0.
* **Sequential reads** take the cache path: ``demand`` is the blocks covering
  the read, ``prefetch`` extends what this policy has already issued up to
  ``offset + size + window`` (measured from the furthest read end of the
  stream, so a late reordered read does not count as a step back), and the
  window doubles after every sequential read, from ``initial_window`` up to
  ``max_window``. The run grows in steps of ``step_blocks`` (at most half
  the window): each step is one fetch call, so a steady reader issues
  several blocks now and then rather than one at almost every read.
* **A read that is not near** switches to random mode and resets the window.
  Random reads of at most ``random_limit`` bytes (default: one block) go
  ``direct``: exactly the requested bytes, uncached, because rounding a small
  read out to whole blocks would multiply the bytes fetched. Larger random
  reads use the cache path (``demand`` blocks, no prefetch): rounding to blocks
  then costs less than 3x, and the next read is likely to hit those blocks.
* **Re-entering sequential mode** needs ``resume_after`` (default 2)
  consecutive near reads in random mode; the one that completes the streak is
  planned as sequential.

Page-cache stores (``stores_ahead``): prefetched blocks also go straight into
the kernel's page cache, so a reader that reads them sends no READ, and the
policy sees a reader jump forward. Then a read at or past the stream position
and inside the issued run, or within the slack past its end, is near (the
kernel served the pages in between). The plans name *tripwires*, one at a
time: a prefetched block whose first page is left out of the store, half the
window before the run's end. Reading it sends one small READ, which plans the
next window (and the next tripwire) while the reader still has stored pages
ahead of it. A read that arrives while a tripwire is still ahead (the reader
outran the stores) extends the run and places none.

Never re-issue: the policy remembers the *issued run* of the current stream,
one contiguous range of block indexes (demand and prefetch). A sequential
read that is not behind the stream position (less the slack) and whose
demand overlaps or touches the run extends it, and prefetch always starts at
the run's end; so a reader that pauses for random reads (a footer, an index)
and comes back re-issues nothing. Any other sequential read starts a new run
(``runs_started``): the reader went elsewhere, e.g. a second pass from
offset 0, and blocks of the old run may be issued again because they may
have been evicted meanwhile (the trio layer skips those it still has cached
or in flight).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReadPlan", "ReadaheadPolicy", "StoreTally", "DEFAULT_SEQUENTIAL_SLACK"]

#: Covers one 1 MiB FUSE read of reordering, more than the kernel's worst
#: case of 256 KiB backwards / 512 KiB forwards (the mount passes its
#: --max-request-size when larger).
DEFAULT_SEQUENTIAL_SLACK = 1 << 20

_NONE = range(0)


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What to do for one read; see the module docstring."""

    sequential: bool
    #: block indexes needed to answer this read (cache path); empty when direct
    demand: range
    #: (offset, length) to fetch uncached for a random read, else None
    direct: tuple[int, int] | None
    #: block indexes to start fetching now, disjoint from earlier issues of this run
    prefetch: range
    #: with stores ahead: the prefetch block whose first page is not stored, else -1
    tripwire: int = -1


# Shared answers for reads at or past EOF (frozen dataclasses are slow to build).
_NOTHING = {mode: ReadPlan(mode, _NONE, None, _NONE) for mode in (False, True)}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class ReadaheadPolicy:
    """Readahead state of one open file handle."""

    def __init__(
        self,
        block_size: int,
        initial_window: int,
        max_window: int,
        *,
        sequential_slack: int | None = None,
        random_limit: int | None = None,
        resume_after: int = 2,
        stores_ahead: bool = False,
        step_blocks: int = 1,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        if not 0 <= initial_window <= max_window:
            raise ValueError("need 0 <= initial_window <= max_window")
        if resume_after < 1:
            raise ValueError("resume_after must be >= 1")
        if step_blocks < 1:
            raise ValueError("step_blocks must be >= 1")
        self.block_size = block_size
        self.initial_window = initial_window
        self.max_window = max_window
        self.sequential_slack = (
            DEFAULT_SEQUENTIAL_SLACK if sequential_slack is None else sequential_slack
        )
        self.random_limit = block_size if random_limit is None else random_limit
        self.resume_after = resume_after
        self.stores_ahead = stores_ahead
        self.step_blocks = step_blocks
        self.reset()

    def reset(self) -> None:
        """Forget all history, e.g. after the object changed generation."""
        #: current readahead window in bytes (an initial window of 0 turns readahead off)
        self.window = self.initial_window
        #: how many issued runs (sequential streams) were started; for metrics and tests
        self.runs_started = 0
        self._sequential = True
        self._streak = 0  # consecutive near reads while in random mode
        self._last_end = 0  # end of the previous read, sequential or not
        self._stream_end = 0  # furthest end reached by the current run's reads
        self._run_start = 0  # issued run of block indexes: [_run_start, _run_end)
        self._run_end = -1  # -1: no run yet, so the first sequential read starts one
        self._tripwire = -1  # the block whose first page is left unstored, until a read reaches it

    @property
    def sequential(self) -> bool:
        """Whether the handle is in sequential mode."""
        return self._sequential

    @property
    def issued(self) -> range:
        """The current issued run (demand and prefetch blocks)."""
        return range(self._run_start, max(self._run_start, self._run_end))

    def plan(self, offset: int, size: int, file_size: int) -> ReadPlan:
        """Classify one read of ``size`` bytes at ``offset`` and plan its fetches."""
        if offset < 0 or size < 0:
            raise ValueError("offset and size must be >= 0")
        if size == 0 or offset >= file_size:
            return _NOTHING[self._sequential]
        end = min(offset + size, file_size)

        slack = self.sequential_slack
        if self._sequential:
            sequential = abs(offset - self._stream_end) <= slack or (
                self.stores_ahead and self._stream_end <= offset <= self._run_end * self.block_size + slack)
        else:
            near = abs(offset - self._last_end) <= slack
            self._streak = self._streak + 1 if near else 0
            sequential = self._streak >= self.resume_after
        self._last_end = end
        if sequential:
            return self._plan_sequential(offset, end, file_size)
        return self._plan_random(offset, end)

    def _plan_random(self, offset: int, end: int) -> ReadPlan:
        if self._sequential:
            self._sequential = False
            self._streak = 0
        self.window = self.initial_window
        length = end - offset
        if length <= self.random_limit:
            return ReadPlan(False, _NONE, (offset, length), _NONE)
        return ReadPlan(False, self._blocks(offset, end), None, _NONE)

    def _plan_sequential(self, offset: int, end: int, file_size: int) -> ReadPlan:
        self._sequential = True
        self._streak = 0
        demand = self._blocks(offset, end)
        if (
            offset >= self._stream_end - self.sequential_slack
            and demand.start <= self._run_end
            and demand.stop >= self._run_start
        ):
            # Not behind the stream position, and within or touching the
            # issued run: the same stream, so extend the run.
            self._run_start = min(self._run_start, demand.start)
            self._run_end = max(self._run_end, demand.stop)
            self._stream_end = max(self._stream_end, end)
        else:
            # A new stream (first read, or resumed away from the old position).
            self._run_start, self._run_end = demand.start, demand.stop
            self._stream_end = end
            self.runs_started += 1
        last = _ceil_div(file_size, self.block_size)
        target = min(
            # From the stream position, not this read's end: a read that
            # arrives late (reordered) must not pull the target backwards.
            _ceil_div(self._stream_end + self.window, self.block_size),
            last,
        )
        # Prefetch in steps of several blocks (each step one fetch call),
        # at most half the window, so a small window still runs ahead.
        step = max(1, min(self.step_blocks, self.window // 2 // self.block_size))
        prefetch = _NONE
        tripwire = -1
        if target >= self._run_end + step or self._run_end < target == last:
            prefetch = range(self._run_end, target)
            self._run_end = target
            if (self.stores_ahead and target < last
                    and self._tripwire <= demand.start):  # one at a time: none is still ahead
                tripwire = self._tripwire = max(prefetch.start,
                                                target - max(1, self.window // 2 // self.block_size))
        self.window = min(self.window * 2, self.max_window)
        return ReadPlan(True, demand, None, prefetch, tripwire)

    def _blocks(self, offset: int, end: int) -> range:
        return range(offset // self.block_size, _ceil_div(end, self.block_size))


class StoreTally:
    """Whether one handle's page-cache stores land before its reader wants them.

    A READ of a block whose store was asked for means the store lost the race:
    the READ is answered from the arena, and the store copies the same bytes a
    second time. A reader faster than the bucket (a cold ``dd``) loses almost
    every race. So once ``LOSING`` of the last ``SAMPLE`` decided stores were
    lost, the handle asks for none for the next ``PAUSE_BLOCKS`` blocks, then
    tries again. A store is decided when its block is READ (lost) or when a
    READ further on shows the reader passed it without one (won).
    """

    SAMPLE = 16
    LOSING = 0.75
    PAUSE_BLOCKS = 64

    def __init__(self) -> None:
        self._pending: set[int] = set()
        self._lost = 0
        self._decided = 0
        self._paused_until = -1
        self.pauses = 0  #: how often the handle paused its stores (for tests)

    def wants(self, block: int) -> bool:
        return block >= self._paused_until

    def asked_for(self, block: int) -> None:
        self._pending.add(block)

    def read(self, blocks: range) -> None:
        """READs reached the FUSE process for ``blocks``."""
        if not self._pending:
            return
        for block in blocks:
            if block in self._pending:
                self._pending.discard(block)
                self._lost += 1
                self._decided += 1
        passed = [block for block in self._pending if block < blocks.start]
        for block in passed:
            self._pending.discard(block)
        self._decided += len(passed)
        if self._decided >= self.SAMPLE:
            if self._lost >= self.LOSING * self._decided:
                self._paused_until = blocks.stop + self.PAUSE_BLOCKS
                self._pending.clear()
                self.pauses += 1
            self._lost = self._decided = 0
