"""The data plane's parts without processes: the arena's allocator, the
arena's regions, the message framing, the descriptor socket, the pushed
tokens and how a worker's memory is measured."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import socket
import threading

import pytest
import trio
import trio.testing

from rapidmount.shared.auth import CredentialsError
from rapidmount.shared.arena import GRANULE, Arena, Granules, WorkerArena
from rapidmount.workers.descriptors import DescriptorInbox
from rapidmount.shared.messages import DESCRIPTOR_TAG, FUSE_DEVICE, WRITE_PIPE_TAGS, FrameReader, encode
from rapidmount.dataplane.worker_process import _private_memory_of, private_memory
from rapidmount.daemon.config import default_workers
from rapidmount.dataplane.token_pusher import RENEW_INTERVAL_S, TokenPusher
from rapidmount.workers.tokens import ASK_AHEAD_S, PushedTokens
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import ObjectMeta


def test_granules_first_fit_and_merge_on_free():
    g = Granules(10)
    assert g.take(4) == 0 and g.take(3) == 4 and g.take(4) is None and g.free == 3
    g.give_back(0, 4)
    assert g.runs() == [(0, 4), (7, 3)]
    g.give_back(4, 3)
    assert g.runs() == [(0, 10)] and g.free == 10


def test_granules_refuse_a_double_free():
    g = Granules(4)
    start = g.take(2)
    g.give_back(start, 2)
    with pytest.raises(ValueError):
        g.give_back(start, 2)


def test_granules_random_model():
    rng = random.Random(7)
    g = Granules(64)
    taken: dict[int, int] = {}
    owner = [None] * 64
    for _ in range(5000):
        if taken and rng.random() < 0.5:
            start = rng.choice(list(taken))
            n = taken.pop(start)
            g.give_back(start, n)
            owner[start:start + n] = [None] * n
        else:
            n = rng.randint(1, 8)
            start = g.take(n)
            if start is None:
                # Really no run of n free granules.
                runs = "".join("." if o is None else "x" for o in owner)
                assert "." * n not in runs
                continue
            assert all(o is None for o in owner[start:start + n])
            owner[start:start + n] = [start] * n
            taken[start] = n
        assert g.free == owner.count(None)


def test_arena_regions_are_shared_and_freed_with_their_last_view():
    arena = Arena(4 * GRANULE)
    worker_side = WorkerArena(arena.fd, arena.size)
    offset, view = arena.allocate(GRANULE + 1)
    assert arena.used == 2 * GRANULE
    worker_side.write(offset, b"hello")
    assert bytes(view[:5]) == b"hello"
    part = view[1:3]
    del view
    assert arena.used == 2 * GRANULE  # a slice keeps the region
    assert bytes(part) == b"el"
    del part
    assert arena.used == 0
    assert arena.allocate(5 * GRANULE) is None and arena.failed_allocations == 1
    assert bytes(worker_side.view(offset, 5)) == b"hello"


def test_regions_of_many_lengths_make_no_new_types():
    """ctypes keeps every array type it makes: a type per read length was a
    leak of the FUSE process (R4: about 30 MiB an hour)."""
    arena = Arena(4 * GRANULE)
    kinds = set()
    for length in range(1, GRANULE, 97):
        offset, view = arena.allocate(length)
        assert len(view) == view.nbytes == length
        kinds.add(type(view.obj))
        del view
    assert len(kinds) == 1
    assert arena.used == 0


def test_frames_split_anywhere_and_carry_errors_and_metadata():
    meta = ObjectMeta("a", 1, 1, 3, 10, 10, False, None, {"k": "v"})
    error = StorageError("gone", errno_=116, object_name="a")
    stream = b"".join(encode(m) for m in [(1, 0, meta), (2, 1, error), (0, "event", ("read", "open"))])
    reader = FrameReader()
    messages = []
    for i in range(0, len(stream), 7):
        messages += reader.feed(stream[i:i + 7])
    assert reader.pending == 0
    assert messages[0] == (1, 0, meta) and dict(messages[0][2].metadata) == {"k": "v"}
    assert messages[1][2].errno == 116 and messages[1][2].object_name == "a" and str(messages[1][2]) == "gone"
    assert messages[2] == (0, "event", ("read", "open"))


def test_a_huge_frame_or_an_unknown_codec_is_a_broken_peer():
    with pytest.raises(ValueError):
        FrameReader().feed((1 << 31).to_bytes(4, "little") + b"\0")
    with pytest.raises(ValueError):
        FrameReader().feed((1).to_bytes(4, "little") + b"\x07x")


def test_answers_of_plain_values_are_marshalled_and_others_pickled():
    """Read and append answers (plain values) never go through pickle, whose
    4 KiB buffer per message fragmented the workers' heaps."""
    read_answer = (12, 0, (1 << 20, (1795675017019205, b"handle", "routing")))
    notice = (0, "rpc_error", ("BidiReadObject", "UNAVAILABLE"))
    assert encode(read_answer)[4] == 0 and encode(notice)[4] == 0  # marshal
    meta = ObjectMeta("a", 1, 1, 3, 10, 10, False, None, {})
    assert encode((3, 0, [meta]))[4] == 1  # pickle
    reader = FrameReader()
    assert reader.feed(encode(read_answer) + encode(notice) + encode((3, 0, [meta]))) == [
        read_answer, notice, (3, 0, [meta])]


def _pass(sock: socket.socket, tag: int, fd: int) -> None:
    assert socket.send_fds(sock, [DESCRIPTOR_TAG.pack(tag)], [fd]) == DESCRIPTOR_TAG.size


def _writers_gone(read_end: int) -> bool:
    """No descriptor of the pipe's write end is open anywhere (a read sees the end)."""
    os.set_blocking(read_end, False)
    try:
        return os.read(read_end, 1) == b""
    except BlockingIOError:
        return False


def test_descriptors_reach_their_calls_whichever_comes_first():
    fuse_devices: list[int] = []

    async def main():
        ours, theirs = socket.socketpair()
        inbox = DescriptorInbox(theirs, fuse_devices.append)
        inbox.start()
        early_read, early_write = os.pipe()
        late_read, late_write = os.pipe()
        os.write(early_write, b"early")
        os.write(late_write, b"late")
        waiting = asyncio.get_running_loop().create_task(inbox.take(9, 5))  # the call before its descriptor
        _pass(ours, 7, early_read)  # a descriptor before its call
        _pass(ours, FUSE_DEVICE, early_write)
        await asyncio.sleep(0.05)
        _pass(ours, 9, late_read)
        late, early = await waiting, await inbox.take(7, 5)
        got = os.read(late, 4), os.read(early, 5)
        for fd in (late, early, early_read, late_read, early_write, late_write):
            os.close(fd)
        inbox.close()
        ours.close()
        return got

    assert asyncio.run(main()) == (b"late", b"early")
    assert len(fuse_devices) == 1
    os.close(fuse_devices[0])


def test_a_write_pipe_made_later_goes_to_its_handler_with_its_id():
    pipes: list[tuple[int, int]] = []

    async def main():
        ours, theirs = socket.socketpair()
        inbox = DescriptorInbox(theirs, lambda fd: None, lambda pipe_id, fd: pipes.append((pipe_id, fd)))
        inbox.start()
        read_end, write_end = os.pipe()
        _pass(ours, WRITE_PIPE_TAGS + 7, read_end)
        for _ in range(100):
            if pipes:
                break
            await asyncio.sleep(0.01)
        os.write(write_end, b"x")
        got = os.read(pipes[0][1], 1)
        for fd in (read_end, write_end, pipes[0][1]):
            os.close(fd)
        inbox.close()
        ours.close()
        return got

    assert asyncio.run(main()) == b"x"
    assert [pipe_id for pipe_id, _ in pipes] == [7]


def test_a_descriptor_whose_call_gave_up_is_closed_and_a_closed_socket_fails_the_waits():
    async def main():
        ours, theirs = socket.socketpair()
        inbox = DescriptorInbox(theirs, os.close)
        inbox.start()
        with pytest.raises(StorageError, match="did not arrive within") as late:
            await inbox.take(11, 0.01)
        read_end, write_end = os.pipe()
        _pass(ours, 11, write_end)
        os.close(write_end)
        for _ in range(500):  # the inbox closes its copy as it arrives
            if _writers_gone(read_end):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the descriptor of a call that gave up stayed open")
        os.close(read_end)
        waiting = asyncio.get_running_loop().create_task(inbox.take(12, 5))
        await asyncio.sleep(0.01)
        ours.close()  # the FUSE process is gone
        with pytest.raises(StorageError, match="descriptor socket closed") as closed:
            await waiting
        return late.value.errno, closed.value.errno

    assert asyncio.run(main()) == (errno.EIO, errno.EIO)


def test_default_workers_grow_with_cores():
    assert [default_workers(c) for c in (1, 2, 4, 8, 64, 192)] == [1, 2, 2, 4, 16, 16]


def test_pushed_tokens_ask_ahead_and_wait_for_a_push():
    now = [0.0]
    asked = []
    tokens = PushedTokens(lambda: asked.append(now[0]), clock=lambda: now[0])
    tokens.push(1, "Bearer one", 3600)
    assert tokens.header() == "Bearer one" and not asked
    now[0] = 3600 - ASK_AHEAD_S + 1
    assert tokens.header() == "Bearer one" and asked == [now[0]]
    assert tokens.header() == "Bearer one" and len(asked) == 1  # asked once per token


def test_a_spent_token_waits_for_the_push_its_ask_brings():
    now = [0.0]
    pushers: list[threading.Thread] = []

    def ask() -> None:
        # Called with the tokens' lock held: the push lands once header() waits for it.
        pushers.append(threading.Thread(target=tokens.push, args=(2, "Bearer two", 3600)))
        pushers[-1].start()

    tokens = PushedTokens(ask, clock=lambda: now[0])
    tokens.push(1, "Bearer one", 100)
    now[0] = 101
    assert tokens.header() == "Bearer two"
    assert len(pushers) == 1
    pushers[0].join(10)


def test_pushed_tokens_give_up_with_one_line():
    now = [0.0]

    def clock():
        now[0] += 10  # time flies while waiting
        return now[0]

    tokens = PushedTokens(lambda: None, clock=clock)
    with pytest.raises(CredentialsError, match="sent none in time"):
        tokens.header()


def test_a_failed_refresh_fails_calls_without_a_usable_token_at_once():
    now = [0.0]
    asked = []
    tokens = PushedTokens(lambda: asked.append(now[0]), clock=lambda: now[0])
    tokens.push(1, "Bearer one", 100)
    tokens.push_failure("cannot get an access token: invalid_grant")
    assert tokens.header() == "Bearer one"  # still usable: kept
    now[0] = 200
    with pytest.raises(CredentialsError, match="invalid_grant"):
        tokens.header()
    assert asked  # and the mount is asked to try again


def test_a_burst_of_refused_calls_in_a_worker_reports_the_token_once_and_waits_for_the_push():
    reports = []

    async def burst():
        loop = asyncio.get_running_loop()
        # The mount's answer to the first report of each token, as the mount sends it:
        # a message later, once every call of the burst, already scheduled, waits.
        answers = {1: lambda: tokens.push(2, "Bearer two", 3600),
                   2: lambda: tokens.push_failure("cannot get an access token: invalid_grant")}

        def report(serial: int) -> None:
            reports.append(serial)
            if serial in answers:
                loop.call_soon(answers.pop(serial))

        tokens = PushedTokens(lambda: None, report)
        tokens.push(1, "Bearer one", 3600)
        results = await asyncio.gather(*(tokens.renew(1, 5) for _ in range(20)))
        late = await tokens.renew(1, 5)  # a call that carried the old token fails after the push
        failed = await tokens.renew(2, 5)
        timed_out = await tokens.renew(2, 0.05)  # nobody answers this report
        return results, late, failed, timed_out

    results, late, failed, timed_out = asyncio.run(burst())
    assert results == [None] * 20 and late is None
    assert failed == "cannot get an access token: invalid_grant"
    assert timed_out.startswith("the mount sent none within")
    assert reports == [1, 2, 2]  # once for the burst; then once per wait for token 2


class _FakeSource:
    def __init__(self) -> None:
        self.header, self.renewals = "Bearer 0", 0

    def current(self):
        return self.header, 3600.0, 3000.0

    def renew(self, refused):
        if refused == self.header:
            self.renewals += 1
            self.header = f"Bearer {self.renewals}"
        return self.current()


class _FakePool:
    """The worker pool as the pusher sees it; what it broadcasts arrives on ``sent``."""

    def __init__(self) -> None:
        self.handlers, self.started_notices = [], []
        self._send, self.sent = trio.open_memory_channel(100)

    def add_notice_handler(self, handler) -> None:
        self.handlers.append(handler)

    async def broadcast(self, kind, payload) -> None:
        await self._send.send((kind, payload))

    def notice(self, kind, value) -> None:
        for handler in self.handlers:
            handler(kind, value)


def test_the_mount_refreshes_once_for_a_burst_of_refusals_from_every_worker():
    source, pool = _FakeSource(), _FakePool()
    pusher = TokenPusher(source, pool)

    async def scenario():
        async def next_token():
            with trio.fail_after(RENEW_INTERVAL_S + 10):
                kind, payload = await pool.sent.receive()
            assert kind == "token"
            return payload

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pusher.run)
            assert await next_token() == (1, "Bearer 0", pytest.approx(3600, abs=1))
            for _ in range(10):  # ten calls on two workers, all with token 1
                pool.notice("token_refused", 1)
            assert await next_token() == (2, "Bearer 1", pytest.approx(3600, abs=1))
            pool.notice("token_refused", 1)  # a late one, after the push of token 2: sent again
            assert await next_token() == (2, "Bearer 1", pytest.approx(3600, abs=1))
            pool.notice("token_refused", 2)  # the fresh token refused too: next refresh a second later
            assert await next_token() == (3, "Bearer 2", pytest.approx(3600, abs=1))
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.WouldBlock):
                pool.sent.receive_nowait()  # nothing more
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert source.renewals == 2 and pusher.renewals == 2


def test_a_workers_private_memory_is_its_rss_anon():
    status = "Name:\tpython\nVmRSS:\t  210000 kB\nRssAnon:\t  123456 kB\nRssFile:\t   20000 kB\nRssShmem:\t   66544 kB\n"
    assert private_memory(status) == 123456 * 1024, "the shared arena (RssShmem) and files do not count"
    assert private_memory("Name:\tkthreadd\n") is None
    assert _private_memory_of(os.getpid()) > 0


def test_a_worker_answers_a_read_from_held_bytes_and_copies_them_only_without_a_reply():
    """``copy_held`` with a READ's ``(unique, skip, length)``: the worker
    writes that READ's reply from the bytes its store still holds (a pipe
    stands in for /dev/fuse) and leaves them there, copying nothing into the
    arena. Without a READ, or one it cannot answer, it copies them as before.
    Bytes no longer held: nothing written, read them again."""
    from rapidmount.shared.messages import IN_KERNEL_ONLY, REPLIED_FROM_HELD
    from rapidmount.shared.fuse_codec import reply_header
    from rapidmount.workers.worker import Worker

    data = os.urandom(2 * GRANULE)
    arena = Arena(4 * GRANULE)
    read_end, write_end = os.pipe()

    class Held:
        device = write_end

        def held(self, ticket: int):
            return data if ticket == 7 else None

    worker = Worker.__new__(Worker)  # only what copy_held touches: the arena and the held stores
    worker.arena, worker.pages = WorkerArena(arena.fd, arena.size), Held()
    offset, view = arena.allocate(len(data))
    try:
        count, sent = asyncio.run(worker.op_copy_held(7, len(data), offset, (21, 4096, 8192)))
        assert (count, sent) == (REPLIED_FROM_HELD, True) and bytes(view) == bytes(len(data))
        assert os.read(read_end, 1 << 20) == reply_header(21, 8192) + data[4096:12288]
        assert asyncio.run(worker.op_copy_held(8, len(data), offset, (22, 0, 4096))) == (IN_KERNEL_ONLY, False)
        # A part past the block: not answered here (the FUSE process would fail it), so copied.
        assert asyncio.run(worker.op_copy_held(7, len(data), offset, (23, len(data) - 10, 20))) == (len(data), False)
        assert bytes(view) == data
        view[:] = bytes(len(data))
        assert asyncio.run(worker.op_copy_held(7, len(data), offset, None)) == (len(data), False)
        assert bytes(view) == data
        os.set_blocking(read_end, False)
        with pytest.raises(BlockingIOError):
            os.read(read_end, 1)
    finally:
        del view
        os.close(read_end)
        os.close(write_end)
