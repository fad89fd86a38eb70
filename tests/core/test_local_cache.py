"""The local cache (--cache-dir) in the core, over MemoryStore: fills, hits, the
live generation only, this mount's changes, damage, restarts, disk faults, and
which opens the kernel may read itself (passthrough).

The mount tests (tests/mount/test_local_cache.py) show the kernel's side.
"""

from __future__ import annotations

import errno
import os
import pathlib

import pytest
import trio
import trio.testing

from rapidmount.core import Filesystem
from rapidmount.core.handles import IoMode
from rapidmount.localcache.cache import FAULT_PAUSE, LocalCache
from rapidmount.localcache.directory import CacheDirectory
from rapidmount.localcache.fill import Fill, FillState
from tests.clock import FakeClock
from tests.core.conftest import CALL_DEADLINE, MiB, Core, payload, settings_of

pytestmark = pytest.mark.trio


class Backing:
    """The FUSE layer's backing files, recorded; ``refuse`` makes the kernel say no."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[tuple[int, int], int, int]] = {}  # ino -> (identity, id, opens)
        self.refuse = False
        self.next_id = 1

    def open(self, ino: int, fd: int, identity: tuple[int, int]) -> int | None:
        held = self.held.get(ino)
        if held is not None:
            if held[0] != identity:
                return None
            self.held[ino] = (identity, held[1], held[2] + 1)
            return held[1]
        if self.refuse:
            return None
        self.held[ino] = (identity, self.next_id, 1)
        self.next_id += 1
        return self.next_id - 1

    def close(self, ino: int) -> None:
        identity, backing_id, opens = self.held[ino]
        if opens == 1:
            del self.held[ino]
        else:
            self.held[ino] = (identity, backing_id, opens - 1)


async def start(nursery: trio.Nursery, store, root: pathlib.Path, *, clock: FakeClock | None = None,
                budget: int = 256 * MiB, fill_size: int = 64 * MiB, backing: Backing | None = None,
                **values) -> Core:
    clock = clock or FakeClock()
    directory = CacheDirectory(root, budget)
    directory.open()
    local = LocalCache(directory, store, bucket=store.bucket, fill_size=fill_size, clock=clock)
    fs = Filesystem(settings_of(**values), store, uid=os.getuid(), gid=os.getgid(), clock=clock, local=local)
    fs.backing = backing
    fs.attach(nursery)
    return Core(fs, store)


async def stop(core: Core) -> None:
    with trio.fail_after(CALL_DEADLINE):
        await core.fs.close_all()
    assert core.fs.local is not None
    await core.fs.local.close()


async def filled(core: Core, name: str) -> None:
    """Until the fill of ``name`` under way has ended."""
    local = core.fs.local
    assert local is not None
    fills = [fill for key, fill in local._fills.items() if key.name == name]
    with trio.fail_after(CALL_DEADLINE):
        for fill in fills:
            await fill.ended()


def poke(path: pathlib.Path, data: bytes) -> None:
    """Overwrite the file's first bytes, its size unchanged."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def mode_of(core: Core, handle) -> IoMode:
    file = core.fs.handles.file(handle.fh)
    if file.backing_id is not None:
        return IoMode.PASSTHROUGH
    return IoMode.DIRECT if file.direct_io else IoMode.CACHED


@pytest.fixture
def store():
    from rapidmount.emulator.memory_store import MemoryStore

    return MemoryStore(kind="zonal")


async def test_the_first_open_fills_from_one_read_and_later_opens_read_the_copy(nursery, store, tmp_path):
    data = payload(20 * MiB + 3, 1)
    store.put("d/shard", data)
    backing = Backing()
    core = await start(nursery, store, tmp_path / "c", backing=backing)
    first = await core.open("d/shard")
    assert mode_of(core, first) is IoMode.CACHED  # read from the fill as it is written
    assert await core.read(first, offset=0) == data
    await filled(core, "d/shard")
    await core.close(first)
    reads = store.calls["reader.read"]
    second = await core.open("d/shard")
    assert mode_of(core, second) is IoMode.PASSTHROUGH
    third = await core.open("d/shard")
    assert core.fs.handles.file(third.fh).backing_id == core.fs.handles.file(second.fh).backing_id
    assert await core.read(second, offset=5) == data[5:]  # the daemon's answer, were a READ to come
    assert store.calls["reader.read"] == reads, "a hit reads nothing from the bucket"
    await core.close(second)
    await core.close(third)
    assert not backing.held, "the backing file is let go with the last passthrough open"
    stats = core.fs.local.stats
    assert (stats.misses, stats.hits, stats.fills, stats.passthrough_opens) == (1, 2, 1, 2)
    await stop(core)


async def test_passthrough_and_cached_opens_of_one_file_never_mix(nursery, store, tmp_path):
    data = payload(3 * MiB, 2)
    store.put("f", data)
    core = await start(nursery, store, tmp_path / "c", backing=Backing())
    cached = await core.open("f")  # a miss, through the page cache
    await filled(core, "f")
    hit = await core.open("f")  # a cached open is open: the hit is served by the mount
    assert (mode_of(core, cached), mode_of(core, hit)) == (IoMode.CACHED, IoMode.CACHED)
    assert await core.read(hit, offset=0) == data
    for handle in (cached, hit):
        await core.close(handle)
    passthrough = await core.open("f")
    writer = await core.open("f", os.O_RDWR)  # while a passthrough open is open: direct
    direct = await core.open("f", os.O_RDONLY | os.O_DIRECT)
    assert [mode_of(core, h) for h in (passthrough, writer, direct)] == [IoMode.PASSTHROUGH, IoMode.DIRECT,
                                                                          IoMode.DIRECT]
    for handle in (passthrough, writer, direct):
        await core.close(handle)
    await stop(core)


async def test_a_refused_backing_file_leaves_the_mount_serving_the_copy(nursery, store, tmp_path):
    data = payload(2 * MiB + 1, 3)
    store.put("f", data)
    backing = Backing()
    backing.refuse = True
    core = await start(nursery, store, tmp_path / "c", backing=backing)
    await core.close(await core.open("f"))
    await filled(core, "f")
    reads = store.calls["reader.read"]
    hit = await core.open("f")
    assert mode_of(core, hit) is IoMode.CACHED
    assert await core.read(hit, offset=0) == data
    assert store.calls["reader.read"] == reads
    await core.close(hit)
    assert core.fs.local.stats.daemon_opens == 2
    await stop(core)


async def test_only_the_live_generation_is_served(nursery, store, tmp_path):
    old, new = payload(3 * MiB, 4), payload(MiB + 7, 5)
    store.put("f", old)
    clock = FakeClock()
    core = await start(nursery, store, tmp_path / "c", clock=clock, metadata_ttl=5.0)
    await core.close(await core.open("f"))
    await filled(core, "f")
    store.put("f", new)  # another client
    handle = await core.open("f")
    assert await core.read(handle, offset=0) == old, "within the TTL the mount's view is the old generation"
    await core.close(handle)
    clock.advance(6)
    handle = await core.open("f")
    assert await core.read(handle, offset=0) == new
    await core.close(handle)
    await filled(core, "f")
    entry = core.fs.local.index.get(store.bucket, "f")
    assert entry is not None and entry.key.generation == store.meta("f").generation and entry.size == len(new)
    assert len(list((tmp_path / "c" / "objects").iterdir())) == 1, "the old generation's file is gone"
    await stop(core)


async def test_this_mounts_write_drops_the_copy_and_a_fill_under_way_is_never_published(nursery, store, tmp_path):
    data = payload(4 * MiB, 6)
    store.put("f", data)
    store.put("g", data)
    core = await start(nursery, store, tmp_path / "c")
    await core.close(await core.open("f"))
    await filled(core, "f")
    await core.write_file("f", b"new bytes")
    assert core.fs.local.index.get(store.bucket, "f") is None
    assert await core.read_file("f") == b"new bytes"
    held = store.hold("reader.read")  # the fill of g waits in its first read
    reader = await core.open("g")
    await trio.testing.wait_all_tasks_blocked()
    writer = await core.open("g", os.O_WRONLY | os.O_TRUNC)
    held.set()
    await core.close(writer)
    await filled(core, "g")
    await core.close(reader)
    assert core.fs.local.index.get(store.bucket, "g") is None
    assert await core.read_file("g") == b""
    await stop(core)


async def test_a_grown_unfinalized_object_is_read_past_its_copy_from_the_bucket(nursery, store, tmp_path):
    first = payload(3 * MiB, 7)
    store.put("log", first, appendable=True)
    clock = FakeClock()
    core = await start(nursery, store, tmp_path / "c", clock=clock, metadata_ttl=1.0, backing=Backing())
    await core.close(await core.open("log"))
    await filled(core, "log")
    store.append_external("log", b"more")
    clock.advance(2)
    handle = await core.open("log")
    assert mode_of(core, handle) is IoMode.CACHED, "a copy shorter than the object is never read by the kernel"
    assert await core.read(handle, offset=0) == first + b"more"
    await core.close(handle)
    await filled(core, "log")
    entry = core.fs.local.index.get(store.bucket, "log")
    assert entry is not None and entry.size == len(first) + 4
    await stop(core)


@pytest.mark.parametrize("damage", ["truncated", "rewritten", "deleted"])
async def test_a_copy_damaged_underneath_is_dropped_and_read_from_the_bucket(nursery, store, tmp_path, damage):
    data = payload(2 * MiB, 8)
    store.put("f", data)
    core = await start(nursery, store, tmp_path / "c")
    await core.close(await core.open("f"))
    await filled(core, "f")
    [victim] = (tmp_path / "c" / "objects").iterdir()
    if damage == "truncated":
        os.truncate(victim, 100)
    elif damage == "rewritten":
        poke(victim, b"x")
    else:
        victim.unlink()
    assert await core.read_file("f") == data
    assert core.fs.local.stats.damaged == 1
    await stop(core)


async def test_a_restart_checks_every_entry_and_drops_what_fails(nursery, store, tmp_path):
    good, bad = payload(MiB, 9), payload(MiB, 10)
    store.put("good", good)
    store.put("bad", bad)
    root = tmp_path / "c"
    core = await start(nursery, store, root)
    for name in ("good", "bad"):
        await core.close(await core.open(name))
        await filled(core, name)
    await stop(core)
    entry = core.fs.local.index.get(store.bucket, "bad")
    path = root / "objects" / entry.key.file_name
    st = path.stat()
    poke(path, b"\0")  # same size, times put back: only the checksum tells
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    (root / "partial" / "left-by-a-crash").write_bytes(b"partial")
    again = await start(nursery, store, root)
    assert not list((root / "partial").iterdir())
    reads = store.calls["reader.read"]
    assert await again.read_file("good") == good
    assert store.calls["reader.read"] == reads
    assert await again.read_file("bad") == bad
    assert again.fs.local.stats.damaged == 1
    await stop(again)


async def test_a_second_cache_on_one_directory_is_refused(nursery, store, tmp_path):
    from rapidmount.localcache.directory import CacheDirError

    core = await start(nursery, store, tmp_path / "c")
    with pytest.raises(CacheDirError, match="in use by another rapidmount"):
        CacheDirectory(tmp_path / "c", MiB).open()
    await stop(core)
    CacheDirectory(tmp_path / "c", MiB).open()  # free again


@pytest.mark.parametrize("where", ["posix_fallocate", "pwrite"])
async def test_enospc_stops_filling_for_a_while_and_reads_go_on(nursery, store, tmp_path, monkeypatch, where):
    data = payload(3 * MiB, 11)
    store.put("f", data)
    clock = FakeClock()
    core = await start(nursery, store, tmp_path / "c", clock=clock)
    real = getattr(os, where)

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, where, full)
    assert await core.read_file("f") == data
    await filled(core, "f")
    assert await core.read_file("f") == data
    assert core.fs.local.stats.fill_faults == 1 and core.fs.local.index.get(store.bucket, "f") is None
    assert core.fs.local.index.reserved == 0
    monkeypatch.setattr(os, where, real)
    assert await core.read_file("f") == data
    assert not core.fs.local._fills, "filling waits out its pause"
    clock.advance(FAULT_PAUSE + 1)
    assert await core.read_file("f") == data
    await filled(core, "f")
    assert core.fs.local.index.get(store.bucket, "f") is not None
    await stop(core)


async def test_eviction_keeps_the_least_recently_used_out(nursery, store, tmp_path):
    for name in "abc":
        store.put(name, payload(MiB, ord(name)))
    core = await start(nursery, store, tmp_path / "c", budget=2 * MiB + 1)
    for name in "ab":
        await core.read_file(name)
        await filled(core, name)
    await core.read_file("a")  # a is used again: b is the oldest
    await core.read_file("c")
    await filled(core, "c")
    assert sorted(e.key.name for e in core.fs.local.index) == ["a", "c"]
    assert core.fs.local.stats.evictions == 1
    assert len(list((tmp_path / "c" / "objects").iterdir())) == 2
    await stop(core)


async def test_objects_past_the_fill_size_come_from_the_bucket(nursery, store, tmp_path):
    data = payload(3 * MiB, 12)
    store.put("big", data)
    core = await start(nursery, store, tmp_path / "c", fill_size=2 * MiB)
    assert await core.read_file("big") == data
    assert not core.fs.local._fills and core.fs.local.index.get(store.bucket, "big") is None
    await stop(core)


async def test_a_fill_s_readers_wait_only_for_what_is_not_written():
    from rapidmount.localcache.index import EntryKey

    fill = Fill(EntryKey("b", "n", 1), 10, "/nowhere")
    fill.advance(4)
    assert fill.readable(4) and not fill.readable(5)
    results: list[bool] = []
    async with trio.open_nursery() as nursery:
        async def wait() -> None:
            results.append(await fill.wait_for(8))

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        fill.advance(2)
        await trio.testing.wait_all_tasks_blocked()
        assert results == []
        fill.end(FillState.FAILED)
    assert results == [False]
