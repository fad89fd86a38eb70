"""The read chain: whole small objects, cached sequential reads, direct random
reads, EOF, generation pinning and ESTALE."""

from __future__ import annotations

import errno
import os
import random

import pytest
import trio.testing

from rapidmount.fuse.destinations import ReadAnswer
from rapidmount.shared.views import Gathered
from tests.core.conftest import MiB, payload

pytestmark = pytest.mark.trio


async def test_whole_small_object_in_one_fetch(core, store):
    data = payload(300_000)
    store.put("small", data)
    handle = await core.open("small")
    await trio.testing.wait_all_tasks_blocked()
    assert core.fs.stats.whole_file_fetches == 1
    pieces = [await core.read(handle, 4096, offset) for offset in range(0, len(data), 4096)]
    assert b"".join(pieces) == data
    assert store.calls["reader.read"] == 1, "every read is answered from the one whole-object fetch"
    await core.close(handle)


async def test_sequential_reads_go_through_the_cache(core, store):
    data = payload(9 * MiB + 123, 1)
    store.put("big", data)
    handle = await core.open("big")
    assert await core.read(handle) == data
    await core.close(handle)
    assert core.fs.stats.blocks_fetched >= 5
    fetched = store.calls["reader.read"]
    # A second pass (another handle, same generation) comes from the cache.
    handle = await core.open("big")
    assert await core.read(handle) == data
    await core.close(handle)
    assert store.calls["reader.read"] == fetched


async def test_reads_over_several_blocks_are_gathered_from_the_blocks_when_asked(core, store):
    """4 MiB reads (requests above 1 MiB) span blocks: with ``gather`` they come as
    views of the cached blocks, in order, and the bytes are exact; without, joined."""
    data = payload(16 * MiB + 999, 3)
    store.put("big", data)
    handle = await core.open("big")
    block = core.fs.cache.block_size
    out = bytearray()
    gathered = 0
    for offset in range(0, len(data), 4 * MiB):
        got = await core.call(core.fs.read, handle.fh, offset, 4 * MiB, True)
        if isinstance(got, Gathered):
            gathered += 1
            assert len(got.parts) >= 2 and all(part.nbytes <= block for part in got.parts)
        out += bytes(got)
    assert out == data and gathered >= 3
    joined = await core.call(core.fs.read, handle.fh, MiB, 4 * MiB)
    assert not isinstance(joined, Gathered) and bytes(joined) == data[MiB:5 * MiB]
    await core.close(handle)


@pytest.mark.parametrize("core_options", [{"cache_block_size": 16 * 1024, "page_cache_budget": 48 * MiB}])
async def test_a_read_over_more_blocks_than_one_reply_gathers_is_joined(core, store):
    """4 MiB over 16 KiB blocks is 256 views: more than a writev takes at
    once, so the read is joined into one buffer instead."""
    data = payload(8 * MiB, 4)
    store.put("small-blocks", data)
    handle = await core.open("small-blocks")
    for offset in range(0, len(data), 4 * MiB):
        got = await core.call(core.fs.read, handle.fh, offset, 4 * MiB, True)
        assert not isinstance(got, Gathered) and bytes(got) == data[offset:offset + 4 * MiB]
    await core.close(handle)


async def test_random_reads_are_direct_and_exact(core, store):
    data = payload(12 * MiB, 2)
    store.put("big", data)
    handle = await core.open("big")
    rng = random.Random(7)
    for _ in range(40):
        offset, size = rng.randrange(len(data)), rng.randrange(1, 70_000)
        assert await core.read(handle, size, offset) == data[offset:offset + size]
    assert core.fs.stats.direct_reads > 0
    await core.close(handle)


async def test_a_read_is_offered_its_reply_where_its_bytes_are_read(core, store):
    """The storage may answer a READ where its bytes land: a random read's
    are all of its reply; a READ within one block that waits for that block
    is offered with the part of the block it wants (``skip``, ``length``).
    A READ over two blocks is cut from both and is never offered."""
    data = payload(96 * MiB, 3)
    store.put("big", data)
    handle = await core.open("big")
    offered: list[tuple[int, int, dict]] = []
    real = core.fs.handles.file(handle.fh).reader

    class Offered:
        async def read(self, offset: int, length: int, *, pages=None, reply=None):
            offered.append((offset, length, {0: reply} if reply is not None else {}))
            return await real.read(offset, length, pages=pages)

        async def read_blocks(self, offset: int, lengths: list[int], pages: list) -> list:
            offered.append((offset, sum(lengths), {}))
            return await real.read_blocks(offset, lengths, pages)

        async def close(self) -> None:
            await real.close()

    core.fs.handles.file(handle.fh).reader = Offered()
    first = ReadAnswer(1)
    assert bytes(await core.call(core.fs.read, handle.fh, 4096, MiB, False, first)) == data[4096:4096 + MiB]
    [block_0] = [waiting for offset, _, waiting in offered if offset == 0]
    assert block_0 == {0: first}, "the READ waits for block 0"
    assert (first.skip, first.length) == (4096, MiB)
    assert all(not waiting for offset, _, waiting in offered if offset), "read ahead: no READ waits for it"
    across = ReadAnswer(3)  # the next sequential READ, over blocks 0 and 1
    got = await core.call(core.fs.read, handle.fh, 4096 + MiB, MiB, False, across)
    assert bytes(got) == data[4096 + MiB:4096 + 2 * MiB]
    assert all(across not in waiting.values() for *_, waiting in offered)
    await trio.testing.wait_all_tasks_blocked()
    offered.clear()
    random_read = ReadAnswer(2)
    got = await core.call(core.fs.read, handle.fh, 80 * MiB + 12_345, 4096, False, random_read)
    assert bytes(got) == data[80 * MiB + 12_345:80 * MiB + 16_441]
    assert offered == [(80 * MiB + 12_345, 4096, {0: random_read})], "the read's own range, all of it"
    assert (random_read.skip, random_read.length) == (0, None)
    await core.close(handle)


@pytest.mark.parametrize("size", [0, 10, 2 * MiB, 3 * MiB + 1])
async def test_read_at_and_past_eof_is_empty(core, store, size):
    store.put("f", payload(size))
    handle = await core.open("f")
    assert await core.read(handle, 4096, size) == b""
    assert await core.read(handle, 4096, size + 5000) == b""
    if size:
        assert await core.read(handle, 4096, size - 1) == payload(size)[-1:]
    await core.close(handle)


async def test_read_of_a_released_handle_is_ebadf(core, store):
    store.put("f", b"x")
    handle = await core.open("f")
    await core.close(handle)
    assert await core.errno(core.fs.read(handle.fh, 0, 1)) == errno.EBADF


async def test_small_handle_pins_its_generation(core, store):
    old, new = payload(5000, 1), payload(7000, 2)
    store.put("f", old)
    handle = await core.open("f")
    await trio.testing.wait_all_tasks_blocked()  # the whole-object fetch is done
    store.put("f", new)  # another client overwrites
    assert await core.read(handle) == old


@pytest.mark.parametrize("kind", ["zonal"])
async def test_open_stream_pins_its_generation(core, store):
    old = payload(8 * MiB, 1)
    store.put("f", old)
    handle = await core.open("f")
    first = await core.read(handle, 1000, 0)  # the stream opens on this generation
    store.put("f", payload(8 * MiB, 2))
    rest = await core.read(handle, len(old), 5 * MiB)  # uncached bytes, same stream
    assert first + rest == old[:1000] + old[5 * MiB:]


async def test_pinned_generation_gone_and_not_cached_is_estale(core, store):
    store.put("f", payload(6 * MiB, 1))
    handle = await core.open("f")
    store.put("f", payload(6 * MiB, 2))
    # The docs say ENOENT on non-zonal buckets; both storage implementations answer ESTALE.
    assert await core.errno(core.read(handle, 4096, 3 * MiB)) in (
        (errno.ESTALE,) if store.kind == "zonal" else (errno.ENOENT, errno.ESTALE))


async def test_cached_bytes_survive_a_delete(core, store):
    data = payload(6 * MiB, 3)
    store.put("f", data)
    handle = await core.open("f")
    assert await core.read(handle, 2 * MiB, 0) == data[:2 * MiB]
    await trio.testing.wait_all_tasks_blocked()
    store.delete_external("f")
    again = await core.open("f")  # the same inode and generation: its cached blocks
    assert await core.read(again, 2 * MiB, 0) == data[:2 * MiB]


@pytest.mark.parametrize("kind", ["zonal", "hns", "flat"])
async def test_cached_bytes_survive_a_delete_for_a_random_read(core, store):
    data = payload(6 * MiB, 3)
    store.put("f", data)
    handle = await core.open("f")
    assert await core.read(handle, 2 * MiB, 0) == data[:2 * MiB]  # block 0 is cached
    store.delete_external("f")
    assert await core.read(handle, 1000, 1000) == data[1000:2000]  # a random read inside block 0


@pytest.mark.parametrize("kind", ["zonal"])
async def test_direct_io_follows_a_growing_object(core, store):
    store.put("log", b"first|", appendable=True)
    handle = await core.open("log", os.O_RDONLY | os.O_DIRECT)
    assert await core.read(handle, 100, 0) == b"first|"
    store.append_external("log", b"second|")
    assert await core.read(handle, 100, 6) == b"second|"
    assert (await core.fstat(handle)).st_size == 13
    plain = await core.open("log")
    store.append_external("log", b"third|")
    assert await core.read(plain, 100, 0) == b"first|second|", "without O_DIRECT: the size seen at open"


@pytest.mark.parametrize("kind", ["zonal"])
async def test_a_handle_reads_what_its_generation_grew_by_as_the_mount_learns_it(core, store):
    """The kernel learns a bigger size from this mount's appends, or a stat,
    and asks for those bytes: a read short of them would become zeros."""
    store.put("log", b"first|", appendable=True)
    reader = await core.open("log")
    assert await core.read(reader, 100, 0) == b"first|"
    appender = await core.open("log", os.O_WRONLY | os.O_APPEND)
    await core.write(appender, b"second|")
    await core.close(appender)
    assert await core.read(reader, 100, 6) == b"second|"
    store.append_external("log", b"third|")
    assert await core.read(reader, 100, 13) == b"", "not yet known to the mount"
    assert (await core.stat("log")).st_size == 19
    assert await core.read(reader, 100, 13) == b"third|"


@pytest.mark.parametrize("kind", ["zonal"])
async def test_unfinalized_last_block_is_not_cached(core, store):
    data = payload(2 * MiB + 500, 4)
    store.put("u", data, appendable=True)
    handle = await core.open("u")
    assert await core.read(handle) == data
    before = store.calls["reader.read"]
    assert await core.read(handle, 500, 2 * MiB) == data[2 * MiB:]
    assert store.calls["reader.read"] > before, "the partial tail is read from storage every time"


async def test_a_handle_open_across_this_mounts_rewrite_reads_what_was_written(core, store):
    """One inode is one file: the kernel shares its page cache among all its
    handles, so a handle left on the old generation after this mount rewrote
    the file would put old bytes where a later open reads them."""
    old, new = payload(5 * MiB, 1), payload(3 * MiB + 7, 2)
    store.put("f", old)
    reader = await core.open("f")
    assert await core.read(reader, MiB, 0) == old[:MiB]  # block 0 of the old generation is cached
    await core.write_file("f", new)
    assert await core.read(reader, MiB, 0) == new[:MiB]
    assert await core.read(reader, 4 * MiB, 2 * MiB) == new[2 * MiB:], "the new size, too"
    assert core.fs.read_now(reader.fh, 0, 4096) == new[:4096]


async def test_a_handle_moves_on_to_this_mounts_generation_with_a_fetch_of_the_old_on_its_way(core, store):
    """A fetch started on the old generation ends on the old stream (its blocks
    keyed to that generation), and that stream is closed once nothing uses it."""
    old, new = payload(8 * MiB, 3), payload(8 * MiB, 4)
    store.put("f", old)
    reader = await core.open("f")
    assert await core.read(reader, MiB, 0) == old[:MiB]  # readahead of the old generation starts
    handle = core.fs.handles.file(reader.fh)
    old_stream, old_fetches = handle.reader, handle.owner
    assert old_fetches.active, "the readahead is on its way"
    await core.write_file("f", new)
    assert await core.read(reader, 8 * MiB, 0) == new
    await trio.testing.wait_all_tasks_blocked()
    assert not old_fetches.active
    assert await core.read(reader, 4096, 0) == new[:4096]
    await trio.testing.wait_all_tasks_blocked()
    assert handle.retired == [] and old_stream._closed, "the old generation's stream was closed"


async def test_a_fetch_of_the_old_generation_stores_nothing_once_the_handle_moved_on(other, store):
    """A fetch made before the handle moved on reads the old generation's
    bytes: none of them may go to the kernel's page cache, which now holds
    the new generation's pages."""
    store.stores_pages = True  # as a mount whose workers store pages
    core = await other()
    old, new = payload(4 * MiB, 5), payload(4 * MiB, 6)
    store.put("f", old)
    reader = await core.open("f")
    handle = core.fs.handles.file(reader.fh)
    stored: list[object] = []

    class Recording:
        async def read(self, offset: int, length: int, *, pages=None, reply=None) -> bytes:
            stored.append(pages)
            return old[offset:offset + length]

        async def read_blocks(self, offset: int, lengths: list[int], pages: list) -> list[bytes]:
            [length], [stored_pages] = lengths, pages
            return [await self.read(offset, length, pages=stored_pages)]

        async def close(self) -> None:
            pass

    handle.reader = Recording()  # the old generation's stream
    _, fetch, _ = core.fs.blocks._fetch(handle, 1, 1, len(old), store=True)
    assert (await fetch(1))[0] == old[2 * MiB:4 * MiB] and stored[-1] is not None, "a store, before the move"
    _, fetch, _ = core.fs.blocks._fetch(handle, 0, 1, len(old), store=True)
    await core.write_file("f", new)
    assert await core.read(reader, MiB, 2 * MiB) == new[2 * MiB:3 * MiB]  # the handle moves on
    assert (await fetch(1))[0] == old[:2 * MiB], "the fetch made before ends on the old stream"
    assert stored[-1] is None, "the old generation's bytes were stored"


async def test_new_generation_read_after_relookup(other, store):
    core = await other(metadata_ttl=0)
    store.put("f", b"old bytes")
    assert await core.read_file("f") == b"old bytes"
    store.put("f", b"new")
    assert await core.read_file("f") == b"new"


async def test_read_now_answers_within_a_cached_block_as_the_chain_would_and_declines_the_rest(core, store):
    """``read_now`` answers a read inside one cached block at once (planned,
    its readahead started); it changes nothing for one it declines: not
    cached, over two blocks, past the end, a small object, pending writes."""
    data = payload(96 * MiB + 5, 7)
    store.put("big", data)
    store.put("small", data[:100_000])
    handle = await core.open("big")
    block = core.fs.cache.block_size
    fs = core.fs
    assert fs.read_now(handle.fh, 0, MiB) is None  # nothing cached yet
    assert bytes(await core.call(fs.read, handle.fh, 0, MiB)) == data[:MiB]  # plans and reads ahead
    await trio.testing.wait_all_tasks_blocked()
    fetched, reads = fs.stats.blocks_fetched, fs.stats.reads
    got = fs.read_now(handle.fh, MiB, MiB)  # the rest of block 0, cached
    assert got is not None and bytes(got) == data[MiB:2 * MiB]
    assert fs.stats.reads == reads + 1
    for offset in range(2 * MiB, 8 * MiB, MiB):  # the blocks read ahead, each answered at once
        await trio.testing.wait_all_tasks_blocked()
        got = fs.read_now(handle.fh, offset, MiB)
        assert got is not None and bytes(got) == data[offset:offset + MiB]
    await trio.testing.wait_all_tasks_blocked()
    assert fs.stats.blocks_fetched > fetched, "reads answered at once still read ahead"
    # Declined, and nothing planned for them:
    policy = fs.handles.file(handle.fh).policy
    before = vars(policy).copy()
    assert fs.read_now(handle.fh, block - 4096, 8192) is None  # over two blocks
    assert fs.read_now(handle.fh, len(data), MiB) is None  # past the end
    assert fs.read_now(handle.fh, 90 * MiB, MiB) is None  # not cached (past the readahead window)
    assert fs.read_now(999_999, 0, MiB) is None  # no such handle
    assert vars(policy) == before
    await core.close(handle)
    small = await core.open("small")
    await trio.testing.wait_all_tasks_blocked()
    assert fs.read_now(small.fh, 0, 4096) is None  # whole small objects: the chain's
    await core.close(small)
    writer = await core.open("big", os.O_RDWR)
    await core.write(writer, b"x", 0)
    assert fs.read_now(writer.fh, 0, 4096) is None  # pending writes are the truth: the chain's
    await core.close(writer)


@pytest.mark.parametrize("kind", ["zonal", "hns", "flat"])
@pytest.mark.parametrize("first", [(0, MiB), (5 * MiB, 4096)], ids=["cached", "direct"])
async def test_a_read_waiting_on_its_stream_when_this_mount_renames_the_file_gets_its_bytes(core, store, first):
    """A rename keeps the file: a read already waiting for its bytes (a block
    fetch, or a random read straight from the stream) gets them, and later
    reads go on under the new name."""
    data = payload(8 * MiB, 9)
    store.put("f", data)
    reader = await core.open("f")
    held = store.hold("reader.read")
    got: list[bytes] = []
    offset, size = first

    async def read_first() -> None:
        got.append(await core.read(reader, size, offset))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_first)
        await trio.testing.wait_all_tasks_blocked()
        assert store.calls["reader.read"], "the read waits for its block"
        await core.rename("f", "g")
        held.set()
    assert got == [data[offset:offset + size]]
    assert await core.read(reader, 8 * MiB, 0) == data
    await core.close(reader)
    assert await core.read_file("g") == data


@pytest.mark.parametrize("first", [(0, MiB), (5 * MiB, 4096)], ids=["cached", "direct"])
async def test_a_read_whose_stream_finds_the_old_name_gone_before_its_rename_is_over_gets_its_bytes(
        core, store, monkeypatch, first):
    """The bucket has moved the object, but its answer has not reached this
    mount yet when the read's stream opens under the old name and finds
    nothing there (ESTALE): the read waits for the rename, then reads on from
    the renamed object."""
    data = payload(8 * MiB, 10)
    store.put("f", data)
    reader = await core.open("f")
    held = store.hold("reader.read")
    moved, answered = trio.Event(), trio.Event()
    move = store.move_object

    async def move_answered_late(*args, **kwargs):
        meta = await move(*args, **kwargs)
        moved.set()
        await answered.wait()
        return meta

    monkeypatch.setattr(store, "move_object", move_answered_late)
    got: list[bytes] = []
    offset, size = first

    async def read_first() -> None:
        got.append(await core.read(reader, size, offset))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_first)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(core.rename, "f", "g")
        await moved.wait()
        held.set()
        await trio.testing.wait_all_tasks_blocked()
        assert not got, "the read waits for the rename"
        assert "NOT_FOUND" in {code for _, code in store.rpc_errors.snapshot()}, "its stream found the name gone"
        answered.set()
    assert got == [data[offset:offset + size]]
    assert await core.read(reader, 8 * MiB, 0) == data
    await core.close(reader)
