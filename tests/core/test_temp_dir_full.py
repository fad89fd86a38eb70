"""A full ``--temp-dir``: every staged write it cannot hold is ENOSPC, and
the object in the bucket stays as it was. The disk is simulated
(``full_temp_dir``), with reservations and without.
"""

from __future__ import annotations

import errno
import logging
import os

import pytest

from tests.core.conftest import MiB, full_temp_dir, payload

pytestmark = pytest.mark.trio

RW = os.O_RDWR
NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL


@pytest.fixture(params=["reservations", "short writes"])
def full_disk(request):
    with full_temp_dir(0, request.param) as disk:
        yield disk


@pytest.fixture
def refusals(caplog):
    caplog.set_level(logging.WARNING, logger="rapidmount")
    return lambda: [r for r in caplog.records if "No space left on device" in r.getMessage()]


def uploads(store) -> int:
    return store.calls["write_object"] + store.calls["appender.create"]


async def test_a_refused_staged_write_is_enospc_and_is_never_uploaded(core, store, full_disk, refusals):
    old = store.put("f", payload(MiB, 1), appendable=store.layout.appendable_objects)
    handle = await core.open("f", RW)
    full_disk.room = MiB + 4096  # the copy fits, the write does not
    before = uploads(store)
    assert await core.errno(core.write(handle, payload(MiB, 2), MiB // 2)) == errno.ENOSPC
    assert await core.errno(core.write(handle, b"x", 0)) == errno.ENOSPC, "the refusal sticks"
    assert await core.errno(core.fsync(handle)) == errno.ENOSPC
    assert await core.errno(core.close(handle)) == errno.ENOSPC
    assert store.meta("f").generation == old.generation and store.data("f") == payload(MiB, 1)
    assert uploads(store) == before
    assert len(refusals()) == 1, "one log line"


async def test_a_truncation_with_a_refused_write_is_never_uploaded(core, store, full_disk):
    old = store.put("f", payload(MiB, 1))
    handle = await core.open("f", os.O_WRONLY | os.O_TRUNC)
    full_disk.room = MiB // 2
    assert await core.errno(core.write(handle, payload(MiB, 2))) == errno.ENOSPC
    assert await core.errno(core.close(handle)) == errno.ENOSPC
    assert store.meta("f").generation == old.generation and store.data("f") == payload(MiB, 1)


@pytest.mark.parametrize("kind", ["hns", "flat"])  # new files on zonal buckets stream
async def test_a_new_flat_file_with_a_refused_write_is_never_created(core, store, full_disk):
    handle = await core.create("f", NEW)
    full_disk.room = 4096
    assert await core.errno(core.write(handle, payload(MiB, 2))) == errno.ENOSPC
    assert await core.errno(core.close(handle)) == errno.ENOSPC
    assert store.meta("f") is None


@pytest.mark.parametrize("full_disk", ["reservations"], indirect=True)  # without, the copy is refused part-way
async def test_a_copy_the_temp_dir_cannot_hold_is_enospc_before_reading_and_changes_nothing(
        core, store, full_disk, refusals):
    old = store.put("big", payload(3 * MiB, 1))
    handle = await core.open("big", RW)
    full_disk.room = MiB
    reads = store.calls["reader.read"]
    assert await core.errno(core.write(handle, b"patch", 10)) == errno.ENOSPC
    assert store.calls["reader.read"] == reads, "refused before reading the object"
    assert await core.errno(core.ftruncate(handle, 2 * MiB)) == errno.ENOSPC
    # Nothing changed: fsync and close have nothing to do.
    await core.fsync(handle)
    await core.close(handle)
    assert store.meta("big").generation == old.generation and store.data("big") == payload(3 * MiB, 1)
    assert len(refusals()) == 2, "one log line per refusal"
    full_disk.room = 8 * MiB  # room again: the same write stages and uploads
    handle = await core.open("big", RW)
    await core.write(handle, b"patch", 10)
    await core.close(handle)
    assert store.data("big") == payload(10, 1) + b"patch" + payload(3 * MiB, 1)[15:]


async def test_a_copy_refused_part_way_is_never_uploaded(core, store, full_disk):
    old = store.put("big", payload(3 * MiB, 1))
    handle = await core.open("big", RW)
    full_disk.room = MiB
    assert await core.errno(core.write(handle, b"patch", 10)) == errno.ENOSPC
    await core.close(handle)
    assert store.meta("big").generation == old.generation and store.data("big") == payload(3 * MiB, 1)


@pytest.mark.parametrize("kind", ["zonal"])
async def test_a_streamed_file_whose_copy_is_refused_goes_on_streaming(core, store, full_disk):
    handle = await core.create("f", NEW)
    await core.write(handle, payload(2 * MiB, 1))
    full_disk.room = MiB
    assert await core.errno(core.write(handle, b"patch", 0)) == errno.ENOSPC
    await core.write(handle, b"tail", 2 * MiB)  # at the end: streams again
    await core.close(handle)
    assert store.data("f") == payload(2 * MiB, 1) + b"tail"


@pytest.mark.parametrize("full_disk", ["reservations"], indirect=True)  # without, the same refusal part-way
async def test_a_truncate_of_a_path_the_temp_dir_cannot_stage_is_enospc(core, store, full_disk):
    old = store.put("big", payload(3 * MiB, 1))
    full_disk.room = MiB
    assert await core.errno(core.truncate("big", 2 * MiB)) == errno.ENOSPC
    assert store.meta("big").generation == old.generation and store.data("big") == payload(3 * MiB, 1)
    full_disk.room = 8 * MiB
    await core.truncate("big", 2 * MiB)
    assert store.data("big") == payload(2 * MiB, 1)


@pytest.mark.parametrize("kind", ["zonal"])
async def test_an_unlink_of_a_streamed_file_the_temp_dir_cannot_copy_is_enospc(core, store, full_disk):
    handle = await core.create("f", NEW)
    await core.write(handle, payload(2 * MiB, 1))
    full_disk.room = MiB
    assert await core.errno(core.unlink("f")) == errno.ENOSPC
    await core.write(handle, b"tail")
    await core.close(handle)
    assert store.data("f") == payload(2 * MiB, 1) + b"tail", "the file and its name stay"
