"""Put read bytes straight into the kernel's page cache (``FUSE_NOTIFY_STORE``).

A worker holds a copy of the mount's ``/dev/fuse`` descriptor. It writes a
fetched block's bytes to the kernel as a store notification, so later
buffered reads and ``mmap`` of those pages are served by the kernel and never
reach the FUSE process. A block stored whole is not put in the arena at all:
its store is *held*, the only copy of its bytes until it is made, and a READ
that comes meanwhile takes them from it (:meth:`PageStorer.held`).

Why the stores run on a thread of their own: a store blocks, in uninterruptible
sleep, on any page a pending READ holds, until that READ is answered. The
event loop must keep answering meanwhile, and no READ ever waits for a store
(it is answered from the arena).

The same descriptor carries the replies to READs that the FUSE process hands
a worker (``ReadCalls.reply`` in ``reads.py``, encoded by
:mod:`rapidmount.shared.fuse_replies`): those are written on the event loop,
never behind a store.

Only bytes that can never change are stored: one generation's, below the size
the kernel knows (the FUSE process decides, see ``core/reads.py``). Before this
mount changes a file whose pages were stored, it raises the file's *epoch* on
every worker (:meth:`PageStorer.drain`): queued stores of older epochs are
dropped, a store under way is waited for, and later ones are refused.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rapidmount.shared import fuse_replies
from rapidmount.shared.fuse_abi import FUSECTL_ROOT
from rapidmount.shared.threads import start_named

log = logging.getLogger("rapidmount.worker")

#: How many raised epochs a worker remembers. A fetch crosses a drain within
#: a round trip; thousands of later drains are far past that.
EPOCHS_KEPT = 65536
#: How many skipped tickets a worker remembers: a skip crosses its store
#: within a round trip.
SKIPS_KEPT = 4096

Report = Callable[[str, int, float], object]  # (outcome, bytes, seconds blocked); what it returns is ignored


@dataclass(slots=True)
class _Store:
    nodeid: int
    epoch: int
    offset: int
    data: bytes | memoryview
    ticket: int = 0
    #: the only copy of its bytes this side of the bucket, until stored: kept for :meth:`PageStorer.held`
    held: bool = False


def abort_connection(connection: int | None, root: str = FUSECTL_ROOT) -> bool:
    """Abort FUSE connection ``connection`` through fusectl: for a worker whose
    FUSE process died while its store thread sleeps on a page locked by a
    READ that nobody will answer now. The abort fails every pending request,
    which wakes the store, so the worker can exit and the mount's readers get
    an error instead of hanging (the worker's descriptor keeps the connection
    alive, so nothing else ends it). True once aborted."""
    if connection is None:
        log.warning("the mount's process is gone while a page-cache store waits; its FUSE connection is unknown, "
                    "so this worker may hang until it is aborted (%s/N/abort)", root)
        return False
    try:
        with open(os.path.join(root, str(connection), "abort"), "w") as knob:
            knob.write("1")
    except OSError as err:
        log.warning("the mount's process is gone while a page-cache store waits; could not abort FUSE "
                    "connection %d (%s)", connection, err.strerror)
        return False
    log.warning("the mount's process is gone while a page-cache store waits: FUSE connection %d aborted, so "
                "its readers get an error instead of hanging", connection)
    return True


class PageStorer:
    """The store thread of one worker, and its queue (at most ``budget`` bytes)."""

    def __init__(self, budget: int, report: Report) -> None:
        self.budget = budget
        self._report = report
        self._fd: int | None = None
        self._queue: collections.deque[_Store] = collections.deque()
        self._queued = 0
        self._current: _Store | None = None
        self._floors: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._skipped: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._held: dict[int, _Store] = {}  # by ticket: held stores queued or being made
        self._closed = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    # -- the descriptor ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread; it stores nothing before :meth:`use_device`."""
        self._thread = start_named(self._run, "page-stores")

    def use_device(self, fd: int) -> None:
        """The mount's ``/dev/fuse`` descriptor (the FUSE process passes it once
        the mount exists); this storer owns and keeps it."""
        with self._lock:
            if self._fd is not None or self._closed:
                os.close(fd)  # only one is ever passed; a late one is not needed
                return
            self._fd = fd
            self._changed.notify_all()

    @property
    def ready(self) -> bool:
        return self._fd is not None and not self._closed

    @property
    def device(self) -> int | None:
        """The ``/dev/fuse`` descriptor, once passed (READ replies are written to it too)."""
        return None if self._closed else self._fd

    # -- from the event loop -------------------------------------------------------------------------

    def submit(self, nodeid: int, epoch: int, offset: int, data: bytes | memoryview, ticket: int = 0, *,
               held: bool = False) -> bool:
        """Queue a store; False (nothing queued) when it cannot be made now.
        A ``held`` store's bytes are nowhere else: :meth:`held` gives them
        until the store is made, and a skip no longer drops it."""
        with self._lock:
            if self._fd is None or self._closed:
                outcome = "unready"
            elif epoch < self._floors.get(nodeid, 0):
                outcome = "stale"
            elif ticket and ticket in self._skipped:
                outcome = "raced"
            elif self._queued + len(data) > self.budget:
                outcome = "full"
            else:
                store = _Store(nodeid, epoch, offset, data, ticket, held)
                self._queue.append(store)
                self._queued += len(data)
                if held:
                    self._held[ticket] = store
                self._changed.notify_all()
                return True
        self._report(outcome, len(data), 0.0)
        return False

    def held(self, ticket: int) -> bytes | memoryview | None:
        """The bytes of held store ``ticket`` while it is queued or being made."""
        with self._lock:
            store = self._held.get(ticket)
            return None if store is None else store.data

    def skip(self, ticket: int) -> None:
        """A READ of that store's pages got to the FUSE process first, which
        answers it from the arena: the store would block on the READ's pages
        and then copy the same bytes again. Drop it if it has not started."""
        with self._lock:
            self._skipped[ticket] = None
            while len(self._skipped) > SKIPS_KEPT:
                self._skipped.popitem(last=False)

    def drain(self, nodeid: int, epoch: int) -> None:
        """Refuse stores of ``nodeid`` older than ``epoch`` from now on, drop the
        queued ones, and return once none is being written. Blocks: run it on a
        thread, never on the event loop."""
        with self._lock:
            if epoch > self._floors.get(nodeid, 0):
                self._floors[nodeid] = epoch
                self._floors.move_to_end(nodeid)
                while len(self._floors) > EPOCHS_KEPT:
                    self._floors.popitem(last=False)
            dropped = [s for s in self._queue if s.nodeid == nodeid and s.epoch < epoch]
            if dropped:
                self._queue = collections.deque(s for s in self._queue if s.nodeid != nodeid or s.epoch >= epoch)
                self._queued -= sum(len(s.data) for s in dropped)
                for store in dropped:
                    self._held.pop(store.ticket, None)
            while (self._current is not None and self._current.nodeid == nodeid
                   and self._current.epoch < epoch):
                self._changed.wait()
        for store in dropped:
            self._report("stale", len(store.data), 0.0)

    def close(self) -> bool:
        """Store nothing more. True when a store is still being made: its
        thread may sleep on a page until a READ is answered."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._held.clear()
            self._queued = 0
            self._changed.notify_all()
            return self._current is not None

    @property
    def storing(self) -> bool:
        """A store is being made now."""
        with self._lock:
            return self._current is not None

    # -- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        with self._lock:
            while self._fd is None and not self._closed:
                self._changed.wait()
            fd = self._fd
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                store = self._take_nearest()
                self._queued -= len(store.data)
                # A held store is made even so: its READ takes the bytes from
                # it meanwhile, and nothing else holds them for the next reader.
                raced = not store.held and bool(store.ticket) and store.ticket in self._skipped
                if not raced:
                    self._current = store
            if raced:
                self._report("raced", len(store.data), 0.0)
                continue
            assert fd is not None  # unset only when closed before the device came, which returned above
            try:
                self._write(fd, store)
            finally:
                with self._lock:
                    self._current = None
                    if store.held:
                        self._held.pop(store.ticket, None)
                    self._changed.notify_all()

    def _take_nearest(self) -> _Store:
        """The lowest offset queued for the file of the oldest store. Several
        streams of one file land their blocks interleaved, far ahead and near;
        a sequential reader wants the near ones first, and a store made after
        its READ came only copies the bytes again. The caller holds the lock."""
        queue = self._queue
        nodeid = queue[0].nodeid
        nearest = min(range(len(queue)), key=lambda i: (queue[i].nodeid != nodeid, queue[i].offset))
        store = queue[nearest]
        del queue[nearest]
        return store

    def _write(self, fd: int, store: _Store) -> None:
        started = time.monotonic()
        try:
            os.writev(fd, [fuse_replies.notify_store_header(store.nodeid, store.offset, len(store.data)), store.data])
        except OSError as err:
            # ENOENT: the kernel forgot the inode (no one has it open or looked
            # up); the READ path serves it if it comes back.
            outcome = "forgotten" if err.errno == errno.ENOENT else "failed"
            if outcome == "failed":
                log.info("could not store %d bytes of inode %d into the page cache: %s",
                         len(store.data), store.nodeid, err.strerror)
            self._report(outcome, len(store.data), time.monotonic() - started)
            return
        self._report("stored", len(store.data), time.monotonic() - started)
