"""Read-only mounts: every change is EROFS, reads work, no write bits."""

from __future__ import annotations

import errno
import os

import pytest

pytestmark = pytest.mark.trio

CHANGES = {
    "open O_WRONLY": lambda c: c.open("f", os.O_WRONLY),
    "open O_RDWR": lambda c: c.open("f", os.O_RDWR),
    "open O_TRUNC": lambda c: c.open("f", os.O_RDONLY | os.O_TRUNC),
    "create": lambda c: c.create("new"),
    "mkdir": lambda c: c.mkdir("newdir"),
    "rmdir": lambda c: c.rmdir("d"),
    "unlink": lambda c: c.unlink("f"),
    "rename": lambda c: c.rename("f", "g"),
    "symlink": lambda c: c.symlink("l", "f"),
    "truncate": lambda c: c.truncate("f", 0),
    "utime": lambda c: _sync(c, lambda ino: c.fs.set_mtime(ino, 10**18)),
    "chmod": lambda c: _sync(c, lambda ino: c.fs.chmod(ino, 0o600)),
    "chown": lambda c: _sync(c, c.fs.chown),
    "access W_OK": lambda c: _sync(c, lambda ino: c.fs.access(ino, os.W_OK)),
}


async def _sync(core, fn):
    result = fn((await core.lookup_path("f")).ino)
    if hasattr(result, "__await__"):
        await result


@pytest.fixture
def core_options():
    return {"read_only": True}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_every_change_is_erofs(core, store, change):
    store.put("f", b"abc")
    store.put("d/x", b"")
    before = {name: store.meta(name) for name in store.names()}
    assert await core.errno(CHANGES[change](core)) == errno.EROFS
    assert {name: store.meta(name) for name in store.names()} == before


async def test_reads_work_and_modes_have_no_write_bits(core, store):
    store.put("d/f", b"abc")
    assert await core.read_file("d/f") == b"abc"
    assert (await core.stat("d/f")).st_mode & 0o222 == 0
    assert (await core.stat("d")).st_mode & 0o222 == 0
    core.fs.access((await core.lookup_path("d/f")).ino, os.R_OK)
