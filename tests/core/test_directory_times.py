"""A directory's times come from the bucket, so a second mount shows the
same ones: its folder's update time (buckets with folders), a time set on
it (kept in its placeholder object ``dir/``), its placeholder's times (flat
buckets). Only an implicit directory of a flat bucket, and the bucket's own
root, show the time the mount started."""

from __future__ import annotations

import errno
import logging
from types import SimpleNamespace

import pytest
import trio

from rapidmount.emulator.convert import folder_proto
from rapidmount.storage.errors import StorageCode
from rapidmount.storage.model import MTIME_METADATA_KEY, parse_mtime
from rapidmount.superblock.inodes import ROOT_INODE
from tests.core.conftest import CALL_DEADLINE, start_core

pytestmark = pytest.mark.trio

WHEN = 981_173_106_123_456_789  # 2001-02-03T04:05:06.123456789Z, as rsync sets it from a source tree
LATER = 1_262_304_000_000_000_001  # 2010-01-01T00:00:00.000000001Z
BUCKET_EPOCH = 1_600_000_000.0  # the bucket's clock: years before any mount starts


@pytest.fixture
def bucket_clock(monkeypatch) -> list[float]:
    """The time the bucket (the emulator's model) stamps on what it makes;
    ``bucket_clock[0] += s`` moves it."""
    now = [BUCKET_EPOCH]
    monkeypatch.setattr("rapidmount.emulator.store_index.time", SimpleNamespace(
        time=lambda: now[0], time_ns=lambda: int(now[0] * 1e9)))
    return now


def folder_time_ns(store, prefix: str) -> int:
    """The folder's update time as the service sends it."""
    return folder_proto(store.model.get_folder(store.bucket, prefix)).update_time.ToNanoseconds()


async def prefetched(nursery, store, **values):
    """A fresh mount whose --prefetch-metadata has cached the whole tree."""
    core = await start_core(nursery, store, prefetch_metadata=True, **values)
    with trio.fail_after(CALL_DEADLINE):
        await core.fs.preload.finished.wait()
    return core


async def times_of(core, path: str) -> tuple[int, int, int]:
    attributes = await core.stat(path)
    return attributes.st_mtime_ns, attributes.st_ctime_ns, attributes.st_atime_ns


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_a_folder_shows_its_update_time_wherever_the_mount_learns_of_it(nursery, store, bucket_clock, other):
    store.put("top/mid/leaf/f", b"x")  # implies three folders, made at the bucket's time
    bucket_clock[0] += 60
    await store.create_folder("top/empty/")
    times = {prefix: folder_time_ns(store, prefix) for prefix in ("top/", "top/mid/", "top/mid/leaf/", "top/empty/")}
    assert times["top/"] == int(BUCKET_EPOCH * 1e9) and times["top/empty/"] == times["top/"] + 60 * 10**9

    looked_up = await other()  # lookups: GetFolder of each
    for prefix, when in times.items():
        assert await times_of(looked_up, prefix) == (when, when, when), prefix

    listed = await other()  # readdirplus: the listing carries each subfolder's time
    assert await listed.listdir("top") == ["empty", "mid"]
    stats = store.calls["stat_name"]
    assert (await listed.stat("top/mid")).st_mtime_ns == times["top/mid/"]
    assert (await listed.stat("top/empty")).st_mtime_ns == times["top/empty/"]
    assert store.calls["stat_name"] == stats  # they came with the listing

    preloaded = await prefetched(nursery, store)
    stats, listings = store.calls["stat_name"], store.calls["list_directory"]
    for prefix, when in times.items():
        assert (await preloaded.stat(prefix)).st_mtime_ns == when, prefix
    assert (store.calls["stat_name"], store.calls["list_directory"]) == (stats, listings)

    rooted = await other(only_dir="top/mid")  # the root is a folder too
    assert await times_of(rooted, "") == (times["top/mid/"],) * 3


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_changes_inside_a_folder_leave_its_time(core, store, bucket_clock, other):
    await core.mkdir("d")
    made = (await core.stat("d")).st_mtime_ns
    assert made == folder_time_ns(store, "d/")
    bucket_clock[0] += 60
    await core.write_file("d/f", b"data")
    await core.mkdir("d/sub")
    await core.unlink("d/f")
    assert (await core.stat("d")).st_mtime_ns == made
    assert (await (await other()).stat("d")).st_mtime_ns == made


async def test_a_time_set_on_a_directory_is_kept_in_its_placeholder(core, store, nursery, other):
    await core.mkdir("made")
    store.put("implied/f", b"x")  # on a flat bucket: no placeholder, until the time is set
    for path in ("made", "implied"):
        await core.call(core.fs.set_mtime, (await core.lookup_path(path)).ino, WHEN)
        assert (await core.stat(path)).st_mtime_ns == WHEN
        placeholder = store.meta(path + "/")
        assert placeholder is not None and placeholder.size == 0
        assert parse_mtime(placeholder.metadata[MTIME_METADATA_KEY]) == WHEN
    await core.call(core.fs.set_mtime, (await core.lookup_path("made")).ino, LATER)  # updates the placeholder
    assert parse_mtime(store.meta("made/").metadata[MTIME_METADATA_KEY]) == LATER
    assert await core.listdir("") == ["implied", "made"], "a placeholder is no entry"

    looked_up = await other()
    assert [(await looked_up.stat(path)).st_mtime_ns for path in ("made", "implied")] == [LATER, WHEN]
    listed = await other()
    await listed.listdir("")
    stats = store.calls["stat_name"]
    assert [(await listed.stat(path)).st_mtime_ns for path in ("made", "implied")] == [LATER, WHEN]
    assert store.calls["stat_name"] == stats
    preloaded = await prefetched(nursery, store)
    assert [(await preloaded.stat(path)).st_mtime_ns for path in ("made", "implied")] == [LATER, WHEN]

    await core.rmdir("made")  # the placeholder goes with it
    assert store.meta("made/") is None and not await core.exists("made")


async def test_a_tree_whose_directory_times_were_set_shows_them_after_a_remount(core, store, other):
    """What ``rsync -a`` does: make the tree, write the files, then set every
    directory's time (deepest first); a second mount must show those times,
    or a second rsync sets them all again."""
    directories = ["t", "t/a", "t/a/b", "t/a/b/c", "t/d"]
    for number, path in enumerate(directories):
        await core.mkdir(path)
        await core.write_file(f"{path}/file{number}", b"x" * number)
    wanted = {path: WHEN + number * 1_000_000_007 for number, path in enumerate(directories)}
    for path in reversed(directories):
        await core.call(core.fs.set_mtime, (await core.lookup_path(path)).ino, wanted[path])
    remounted = await other()
    assert {path: (await remounted.stat(path)).st_mtime_ns for path in directories} == wanted
    walked = await other()
    shown = {}
    for path in directories:
        await walked.listdir(path)
        shown[path] = (await walked.stat(path)).st_mtime_ns
    assert shown == wanted


@pytest.mark.parametrize("kind", ["flat"])
async def test_a_flat_buckets_directories_show_their_placeholders_times(core, store, bucket_clock, other):
    store.put("explicit/", b"")
    store.put("implicit/f", b"x")
    placeholder = store.meta("explicit/")
    fresh = await other()
    explicit, implicit = await fresh.stat("explicit"), await fresh.stat("implicit")
    assert (explicit.st_mtime_ns, explicit.st_ctime_ns) == (placeholder.mtime_ns, placeholder.ctime_ns)
    assert placeholder.mtime_ns == int(BUCKET_EPOCH * 1e9)
    mount_time = fresh.fs.attributes.mount_time_ns
    assert (implicit.st_mtime_ns, implicit.st_ctime_ns) == (mount_time, mount_time)
    await core.mkdir("new")
    assert (await core.stat("new")).st_mtime_ns == store.meta("new/").mtime_ns
    assert (await (await other()).stat("new")).st_mtime_ns == store.meta("new/").mtime_ns


async def test_the_buckets_root_keeps_a_time_only_in_memory(core, store, other, caplog):
    caplog.set_level(logging.WARNING, logger="rapidmount.fs")
    for when in (WHEN, LATER):
        await core.call(core.fs.set_mtime, ROOT_INODE, when)
    assert (await core.stat("")).st_mtime_ns == LATER
    assert store.names() == []
    assert [r.getMessage() for r in caplog.records].count(
        "the bucket's root directory keeps no times: the time set on the mount's root is kept until this mount "
        "ends, not in the bucket") == 1
    fresh = await other()
    assert (await fresh.stat("")).st_mtime_ns == fresh.fs.attributes.mount_time_ns


async def test_an_only_dir_roots_time_is_kept_in_its_placeholder(store, other):
    store.put("area/f", b"x")
    rooted = await other(only_dir="area")
    await rooted.call(rooted.fs.set_mtime, ROOT_INODE, WHEN)
    assert parse_mtime(store.meta("area/").metadata[MTIME_METADATA_KEY]) == WHEN
    assert (await (await other(only_dir="area")).stat("")).st_mtime_ns == WHEN
    assert (await (await other()).stat("area")).st_mtime_ns == WHEN


async def test_a_placeholder_another_client_changed_still_takes_the_time(core, store, other):
    store.put("d/f", b"x")
    store.put("d/", b"", metadata={"theirs": "kept"})
    inode = await core.lookup_path("d")
    store.put("d/", b"", metadata={"theirs": "new"})  # a new generation the mount never saw
    await core.call(core.fs.set_mtime, inode.ino, WHEN)
    assert dict(store.meta("d/").metadata) == {"theirs": "new", MTIME_METADATA_KEY: "2001-02-03T04:05:06.123456789Z"}
    store.delete_external("d/")  # gone since
    await core.call(core.fs.set_mtime, inode.ino, LATER)
    assert parse_mtime(store.meta("d/").metadata[MTIME_METADATA_KEY]) == LATER
    assert (await (await other()).stat("d")).st_mtime_ns == LATER


async def test_a_time_the_bucket_refuses_to_keep_fails_the_call(core, store):
    await core.mkdir("d")  # a folder, or (flat buckets) a placeholder
    inode = await core.lookup_path("d")
    store.fail_next("write_object", StorageCode.PERMISSION_DENIED)
    store.fail_next("update_metadata", StorageCode.PERMISSION_DENIED)
    assert await core.errno(core.fs.set_mtime(inode.ino, WHEN)) == errno.EACCES
    placeholder = store.meta("d/")
    assert placeholder is None or MTIME_METADATA_KEY not in placeholder.metadata
    assert (await core.stat("d")).st_mtime_ns != WHEN


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_a_renamed_folder_shows_the_rename_unless_a_time_was_set(core, store, bucket_clock, other):
    await core.mkdir("plain")
    await core.mkdir("timed")
    await core.call(core.fs.set_mtime, (await core.lookup_path("timed")).ino, WHEN)
    bucket_clock[0] += 60
    await core.rename("plain", "plain2")
    await core.rename("timed", "timed2")
    renamed = folder_time_ns(store, "plain2/")
    assert renamed == int((BUCKET_EPOCH + 60) * 1e9)
    for mount in (core, await other()):
        assert (await mount.stat("plain2")).st_mtime_ns == renamed
        assert (await mount.stat("timed2")).st_mtime_ns == WHEN
        assert (await mount.stat("timed2")).st_ctime_ns == folder_time_ns(store, "timed2/")


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_a_listing_whose_folders_fail_to_list_still_lists(store, other, bucket_clock):
    store.put("d/sub/f", b"x")
    fresh = await other()
    store.fail_next("list_child_folders", StorageCode.PERMISSION_DENIED)
    assert await fresh.listdir("d") == ["sub"]
    assert (await (await other()).stat("d/sub")).st_mtime_ns == folder_time_ns(store, "d/sub/")


@pytest.mark.parametrize("kind", ["zonal", "hns"])
async def test_only_a_listing_with_subdirectories_asks_for_folders(core, store):
    store.put("d/leaf/f", b"x")
    assert await core.listdir("d/leaf") == ["f"]
    assert store.calls["list_child_folders"] == 0
    assert await core.listdir("d") == ["leaf"]
    assert store.calls["list_child_folders"] == 1
