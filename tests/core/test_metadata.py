"""Times and modes set on files are kept in object metadata, as gcsfuse and
rclone keep them, and a second mount of the same bucket sees them."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from rapidmount.storage.model import MODE_METADATA_KEY, MTIME_METADATA_KEY, parse_mtime

pytestmark = pytest.mark.trio
WHEN = 981_173_106_123_456_789  # 2001-02-03T04:05:06.123456789Z


async def test_a_time_set_on_an_open_new_file_is_stored_at_close(core, store, other):
    handle = await core.create("touched")
    await core.write(handle, b"data")
    await core.fs.set_mtime((await core.lookup_path("touched")).ino, WHEN)
    await core.close(handle)
    assert parse_mtime(store.meta("touched").metadata[MTIME_METADATA_KEY]) == WHEN
    fresh = await other()
    assert (await fresh.stat("touched")).st_mtime_ns == WHEN


async def test_a_write_after_the_time_was_set_makes_it_now(core, store):
    handle = await core.create("f")
    await core.fs.set_mtime((await core.lookup_path("f")).ino, WHEN)
    await core.write(handle, b"later")
    await core.close(handle)
    assert MTIME_METADATA_KEY not in store.meta("f").metadata


async def test_a_time_set_after_close_before_release_is_kept(core, store, other):
    """tar -x: close(), then utimensat() by path while the release may still run."""
    handle = await core.create("t")
    await core.write(handle, b"x" * 1000)
    await core.fsync(handle)
    ino = (await core.lookup_path("t")).ino
    await core.fs.set_mtime(ino, WHEN)
    await core.close(handle)
    assert (await (await other()).stat("t")).st_mtime_ns == WHEN


async def test_utime_is_refused_when_another_client_replaced_the_object(core, store):
    store.put("f", b"mine")
    ino = (await core.lookup_path("f")).ino
    store.put("f", b"theirs")
    assert await core.errno(core.fs.set_mtime(ino, WHEN)) == errno.ESTALE
    assert store.data("f") == b"theirs" and MTIME_METADATA_KEY not in store.meta("f").metadata


@pytest.mark.parametrize("core_options", [{"preserve_mode": True}])
async def test_preserve_mode_keeps_chmod_in_metadata(core, store, other):
    store.put("script.sh", b"#!/bin/sh\n")
    ino = (await core.lookup_path("script.sh")).ino
    await core.fs.chmod(ino, 0o755)
    assert store.meta("script.sh").metadata[MODE_METADATA_KEY] == "100755"
    assert (await (await other(preserve_mode=True)).stat("script.sh")).st_mode == stat.S_IFREG | 0o755
    assert (await (await other()).stat("script.sh")).st_mode == stat.S_IFREG | 0o644, "off by default"


@pytest.mark.parametrize("core_options", [{"preserve_mode": True}])
async def test_preserve_mode_on_a_new_file_and_across_rewrites(core, store):
    handle = await core.create("tool")
    await core.write(handle, b"#!/bin/sh\necho hi\n")
    await core.fs.chmod((await core.lookup_path("tool")).ino, 0o750)
    await core.close(handle)
    assert store.meta("tool").metadata[MODE_METADATA_KEY] == "100750"
    handle = await core.open("tool", os.O_RDWR)
    await core.write(handle, b"#")  # a rewrite at offset 0: staged, a new generation
    await core.close(handle)
    assert store.meta("tool").metadata[MODE_METADATA_KEY] == "100750"


@pytest.mark.parametrize("core_options", [{"preserve_mode": True}])
async def test_chmod_after_a_rewrite_is_conditional_on_the_new_generation(core, store):
    """A chmod bumps the metageneration; a rewrite then starts a generation
    whose count starts again. The next chmod must be checked against that
    one, not refused as if another client had changed the object."""
    store.put("f", b"old\n")
    ino = (await core.lookup_path("f")).ino
    await core.fs.chmod(ino, 0o666)
    handle = await core.open("f", os.O_RDWR)
    await core.write(handle, b"new\n", offset=0)  # staged, uploaded as a new generation at close
    await core.close(handle)
    await core.fs.chmod(ino, 0o600)
    assert store.meta("f").metadata[MODE_METADATA_KEY] == "100600"
    assert store.data("f") == b"new\n"
