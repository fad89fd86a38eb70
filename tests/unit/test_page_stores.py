"""The worker's page-cache store thread (rapidmount.workers.pagestore), on a pipe.

A pipe stands in for /dev/fuse: what the thread writes is read back and
parsed, and a pipe that nobody reads holds a store in the middle of its
write, as a page locked by a pending READ holds one in the kernel.
The mount tests (tests/mount/test_page_stores.py) store into a real mount.
"""

from __future__ import annotations

import os
import struct
import threading

import pytest

from rapidmount.workers.pagestore import PageStorer, abort_connection
from rapidmount.shared.fuse_abi import NotifyCode
from rapidmount.shared.fuse_codec import notify_store_header as store_header
from rapidmount.storage.counters import PageStoreCounts

KiB = 1 << 10
FUSE_NOTIFY_STORE = NotifyCode.STORE


class Pipe:
    """A pipe handed to a PageStorer the way the FUSE process hands it /dev/fuse."""

    def __init__(self, budget: int = 1 << 20) -> None:
        self.read_end, self.write_end = os.pipe()
        self.counts = PageStoreCounts()
        self.reported = threading.Condition()
        self.storer = PageStorer(budget, self._report)
        self.storer.start()
        self.storer.use_device(os.dup(self.write_end))
        os.close(self.write_end)  # the storer has its own copy now

    def _report(self, outcome: str, size: int, seconds: float) -> None:
        with self.reported:
            self.counts.add(outcome, size, seconds)
            self.reported.notify_all()

    def wait_ready(self) -> None:
        for _ in range(30_000):  # the thread receives the descriptor at once; 30 s at most
            if self.storer.ready:
                return
            threading.Event().wait(0.001)
        raise AssertionError("the store thread never got its descriptor")

    def wait_outcomes(self, count: int) -> None:
        with self.reported:
            assert self.reported.wait_for(lambda: sum(self.counts.stores.values()) >= count, timeout=30)

    def messages(self, total: int) -> list[tuple[int, int, int, bytes]]:
        """Read ``total`` bytes back: (nodeid, offset, size, data) of each message."""
        raw = bytearray()
        while len(raw) < total:
            raw += os.read(self.read_end, total - len(raw))
        found, at = [], 0
        while at < len(raw):
            length, error, unique, nodeid, offset, size, _ = struct.unpack_from("<IiQQQII", raw, at)
            assert (error, unique, length) == (FUSE_NOTIFY_STORE, 0, 40 + size)
            found.append((nodeid, offset, size, bytes(raw[at + 40:at + length])))
            at += length
        return found

    def close(self) -> None:
        self.storer.close()
        os.close(self.read_end)


@pytest.fixture
def pipe():
    made = Pipe()
    made.wait_ready()
    yield made
    made.close()


def test_a_store_is_one_message_header_then_bytes(pipe):
    assert pipe.storer.submit(7, 0, 8192, b"x" * 4096)
    pipe.wait_outcomes(1)
    assert pipe.messages(40 + 4096) == [(7, 8192, 4096, b"x" * 4096)]
    assert pipe.counts.stores["stored"] == 1 and pipe.counts.bytes["stored"] == 4096
    assert store_header(7, 8192, 4096)[:4] == (40 + 4096).to_bytes(4, "little")


def test_nothing_is_queued_before_the_descriptor_arrives():
    counts = PageStoreCounts()
    storer = PageStorer(1 << 20, counts.add)
    assert not storer.submit(1, 0, 0, b"x")
    assert counts.stores["unready"] == 1


def test_the_queue_keeps_to_its_budget():
    made = Pipe(budget=96 * KiB)
    made.wait_ready()
    try:
        # The pipe holds 64 KiB: the first store blocks half-way, the second waits in the queue.
        assert made.storer.submit(1, 0, 0, b"a" * (80 * KiB))
        assert made.storer.submit(1, 0, 80 * KiB, b"b" * (16 * KiB))
        assert not made.storer.submit(1, 0, 96 * KiB, b"c" * (32 * KiB))
        assert made.counts.stores["full"] == 1
        got = made.messages(2 * 40 + 96 * KiB)
        assert [(n, o, s) for n, o, s, _ in got] == [(1, 0, 80 * KiB), (1, 80 * KiB, 16 * KiB)]
    finally:
        made.close()


def test_stores_go_out_nearest_first_within_the_oldest_file():
    """Streams of one file land blocks interleaved, far and near: the queue
    makes the lowest offset of the oldest store's file first, so files take
    turns by age and each goes nearest first."""
    made = Pipe(budget=1 << 20)
    made.wait_ready()
    try:
        # The first store fills the 64 KiB pipe and blocks: the rest queue behind it.
        assert made.storer.submit(1, 0, 0, b"a" * (80 * KiB))
        for nodeid, offset in ((1, 12 * KiB * 16), (2, 0), (1, 4 * KiB * 32), (1, 8 * KiB * 32), (2, 4 * KiB)):
            assert made.storer.submit(nodeid, 0, offset, b"b" * (4 * KiB))
        got = made.messages(6 * 40 + 80 * KiB + 5 * 4 * KiB)
        # 128 KiB before 192 KiB of file 1; then file 2's, by then the oldest, before file 1's last.
        assert [(n, o) for n, o, _, _ in got] == [(1, 0), (1, 128 * KiB), (1, 192 * KiB), (2, 0), (1, 256 * KiB),
                                                  (2, 4 * KiB)]
    finally:
        made.close()


def test_drain_drops_queued_stores_waits_for_the_one_being_written_and_refuses_older_epochs(pipe):
    # Store A blocks in the pipe (larger than its 64 KiB); B waits behind it;
    # C is another node's and survives the drain.
    assert pipe.storer.submit(5, 0, 0, b"A" * (128 * KiB))
    assert pipe.storer.submit(5, 0, 128 * KiB, b"B" * (4 * KiB))
    assert pipe.storer.submit(6, 0, 0, b"C" * (4 * KiB))
    first = os.read(pipe.read_end, 40)  # A's header: A is being written now, and cannot finish
    drained = threading.Event()

    def drain() -> None:
        pipe.storer.drain(5, 1)
        drained.set()

    drainer = threading.Thread(target=drain)
    drainer.start()
    drainer.join(timeout=0.5)  # a drain that did not wait for A would be back by now
    assert not drained.is_set()
    rest = bytearray()
    while len(rest) < 128 * KiB:
        rest += os.read(pipe.read_end, 128 * KiB - len(rest))
    drainer.join(timeout=30)
    assert drained.is_set()
    assert struct.unpack_from("<IiQQQII", first)[3:6] == (5, 0, 128 * KiB)
    assert pipe.messages(40 + 4 * KiB) == [(6, 0, 4 * KiB, b"C" * (4 * KiB))]  # B was dropped
    assert not pipe.storer.submit(5, 0, 0, b"old")  # made for the old bytes: refused
    assert pipe.counts.stores["stale"] == 2  # B, dropped from the queue, and this one
    assert pipe.storer.submit(5, 1, 0, b"n" * 4096)
    pipe.wait_outcomes(5)
    assert pipe.messages(40 + 4096) == [(5, 0, 4096, b"n" * 4096)]


def test_a_failed_write_is_counted_not_raised():
    made = Pipe()
    made.wait_ready()
    os.close(made.read_end)  # EPIPE from now on
    made.read_end = os.open(os.devnull, os.O_RDONLY)
    try:
        assert made.storer.submit(1, 0, 0, b"x" * 4096)
        made.wait_outcomes(1)
        assert made.counts.stores["failed"] == 1
        assert made.storer.submit(1, 0, 4096, b"y" * 4096)  # the thread goes on
        made.wait_outcomes(2)
    finally:
        made.close()


def test_a_skipped_ticket_is_not_stored_queued_or_not(pipe):
    assert pipe.storer.submit(3, 0, 0, b"A" * (128 * KiB), ticket=1)  # blocks in the pipe
    first = os.read(pipe.read_end, 40)
    assert pipe.storer.submit(3, 0, 128 * KiB, b"B" * 4096, ticket=2)  # queued behind it
    pipe.storer.skip(2)
    pipe.storer.skip(3)
    assert not pipe.storer.submit(3, 0, 256 * KiB, b"C" * 4096, ticket=3)  # skipped before it came
    rest = bytearray()
    while len(rest) < 128 * KiB:
        rest += os.read(pipe.read_end, 128 * KiB - len(rest))
    pipe.wait_outcomes(3)
    assert struct.unpack_from("<IiQQQII", first)[3:6] == (3, 0, 128 * KiB)
    assert pipe.counts.stores == {**pipe.counts.stores, "stored": 1, "raced": 2}
    assert pipe.storer.submit(3, 0, 512 * KiB, b"D" * 4096, ticket=4)
    assert pipe.messages(40 + 4096) == [(3, 512 * KiB, 4096, b"D" * 4096)]  # B never reached the pipe


def test_a_held_store_gives_its_bytes_until_it_is_made_and_a_skip_does_not_drop_it(pipe):
    """A held store's bytes are nowhere else (the block went only to the
    kernel's page cache): a READ that came first takes them from it, while
    queued or being written, and the store is made all the same."""
    assert pipe.storer.submit(4, 0, 0, b"A" * (128 * KiB), ticket=1, held=True)  # blocks in the pipe
    first = os.read(pipe.read_end, 40)
    assert pipe.storer.submit(4, 0, 128 * KiB, b"B" * 4096, ticket=2, held=True)  # queued behind it
    assert pipe.storer.held(1) == b"A" * (128 * KiB), "being written"
    assert pipe.storer.held(2) == b"B" * 4096, "queued"
    assert pipe.storer.held(3) is None
    pipe.storer.skip(2)  # its READ came: it takes the bytes, the store still goes on
    assert not pipe.storer.submit(4, 0, 256 * KiB, b"C" * 4096, ticket=2, held=True), "skipped before it came"
    rest = bytearray()
    while len(rest) < 128 * KiB:
        rest += os.read(pipe.read_end, 128 * KiB - len(rest))
    assert pipe.messages(40 + 4096) == [(4, 128 * KiB, 4096, b"B" * 4096)]
    pipe.wait_outcomes(3)
    assert struct.unpack_from("<IiQQQII", first)[3:6] == (4, 0, 128 * KiB)
    assert pipe.counts.stores == {**pipe.counts.stores, "stored": 2, "raced": 1}
    assert pipe.storer.held(1) is None and pipe.storer.held(2) is None, "made: the kernel has them"


def test_a_held_store_dropped_by_a_drain_or_close_gives_nothing(pipe):
    assert pipe.storer.submit(8, 0, 0, b"A" * (128 * KiB), ticket=1, held=True)  # blocks in the pipe
    os.read(pipe.read_end, 40)
    assert pipe.storer.submit(8, 0, 128 * KiB, b"B" * 4096, ticket=2, held=True)
    assert pipe.storer.submit(9, 0, 0, b"C" * 4096, ticket=3, held=True)
    drainer = threading.Thread(target=pipe.storer.drain, args=(9, 1))
    drainer.start()
    drainer.join(timeout=30)
    assert pipe.storer.held(3) is None and pipe.storer.held(2) == b"B" * 4096
    pipe.storer.close()
    assert pipe.storer.held(2) is None
    rest = bytearray()
    while len(rest) < 128 * KiB:
        rest += os.read(pipe.read_end, 128 * KiB - len(rest))


def test_close_says_whether_a_store_is_still_being_written(pipe):
    # A store larger than the pipe blocks in its write, as a store blocks on a
    # page a READ holds: close says so (the worker may then have to abort).
    assert pipe.storer.submit(5, 0, 0, b"A" * (128 * KiB))
    os.read(pipe.read_end, 40)  # its header is out: it is being written now
    assert pipe.storer.close() is True
    rest = bytearray()
    while len(rest) < 128 * KiB:
        rest += os.read(pipe.read_end, 128 * KiB - len(rest))
    quiet = Pipe()
    quiet.wait_ready()
    assert quiet.storer.close() is False  # nothing being written
    os.close(quiet.read_end)


def test_abort_connection_writes_fusectls_abort_knob_and_never_raises(tmp_path):
    (tmp_path / "52").mkdir()
    assert abort_connection(52, root=str(tmp_path)) is True
    assert (tmp_path / "52" / "abort").read_text() == "1"
    assert abort_connection(53, root=str(tmp_path)) is False  # no such connection: one log line
    assert abort_connection(None, root=str(tmp_path)) is False  # never told which


def test_a_worker_aborts_only_once_its_fuse_process_is_gone_and_a_store_still_sleeps(monkeypatch):
    """A dying FUSE process closes the worker's socket before the worker is
    given another parent: the worker waits to see that, rather than take a
    parent still exiting for an unmount and leave a store asleep for good."""
    import asyncio

    from rapidmount.workers import main as worker

    monkeypatch.setattr(worker, "PARENT_EXIT_S", 0.05)
    parents = iter([10, 10, 10, 1])
    monkeypatch.setattr(worker.os, "getppid", lambda: next(parents))
    assert asyncio.run(worker._parent_gone(10, lambda: True))  # gone on the fourth look
    monkeypatch.setattr(worker.os, "getppid", lambda: 10)
    assert not asyncio.run(worker._parent_gone(10, lambda: True))  # alive past the wait: an unmount
    assert not asyncio.run(worker._parent_gone(10, lambda: False))  # the store ended: nothing to abort


def test_store_outcomes_reach_the_fuse_process_summed_in_one_notice_per_period():
    """A notice per block stored woke the FUSE process for a counter: the
    worker sums the store thread's outcomes and sends them at most every
    STORE_REPORT_S, and what is left at its end when it stops."""
    import asyncio

    from rapidmount.shared.messages import NOTICE
    from rapidmount.workers.store_reports import StoreReports

    sent: list = []

    async def main() -> None:
        arrived = asyncio.Event()

        def send(message) -> None:
            sent.append(message)
            arrived.set()

        reports = StoreReports(asyncio.get_running_loop(), send)
        thread = threading.Thread(target=lambda: [reports.add("stored", 2 * KiB, 0.5) for _ in range(100)]
                                  + [reports.add("raced", 0, 0.0)])
        thread.start()
        thread.join()
        await asyncio.wait_for(arrived.wait(), 10)
        reports.add("stored", KiB, 0.25)
        reports.flush()  # the worker stopping: what is left goes now

    asyncio.run(main())
    assert [kind for _, kind, _ in sent] == ["page_stores", "page_stores"] and sent[0][0] == NOTICE
    assert sorted(sent[0][2]) == [("raced", 1, 0, 0.0), ("stored", 100, 200 * KiB, 50.0)]
    assert sent[1][2] == [("stored", 1, KiB, 0.25)]
    counts = PageStoreCounts()
    for outcome, count, size, seconds in sent[0][2] + sent[1][2]:
        counts.add(outcome, size, seconds, count)
    assert counts.stores["stored"] == 101 and counts.bytes["stored"] == 201 * KiB and counts.seconds == 50.25
