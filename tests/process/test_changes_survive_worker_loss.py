"""A change whose data-plane worker dies after the bucket made it, before the
answer came back: WorkerStore makes it again on another worker, recognises
the first attempt's effect in the refusal, and reports success, once.

The emulator runs in this process, so each test wraps one of its store's
methods: the change is made, then every worker of the pool is killed before
the service answers.
"""

from __future__ import annotations

import errno
import os
import signal
import tempfile
import time

import pytest

from rapidmount.storage.errors import StorageError
from tests.conftest import FLAT_BUCKET, HNS_BUCKET, ZONAL_BUCKET
from tests.workerstore import make_worker_store, run_with_workers, stat_bools


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def kill_after(emulator, store, method: str, times: int = 1) -> list[int]:
    """The next ``times`` calls of the emulator's ``method`` happen, then every
    worker of ``store`` is SIGKILLed, and is dead before the service answers.
    Returns the list the killed pids are added to."""
    original = getattr(emulator.store, method)
    killed: list[int] = []

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        if len(killed) < times:
            pids = [c.pid for c in store.pool.live()]
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while not all(_dead(pid) for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.005)
            killed.extend(pids)
        return result

    setattr(emulator.store, method, wrapped)
    return killed


@pytest.fixture
def make_store(emulator):
    def make(bucket: str):
        return make_worker_store(emulator.endpoint, bucket, workers=2, deadline=20.0)
    return make


def test_a_delete_made_again_after_its_worker_died_succeeds(emulator, make_store):
    generation = emulator.seed(FLAT_BUCKET, "gone", b"x")
    store = make_store(FLAT_BUCKET)
    killed = kill_after(emulator, store, "delete_object")

    async def main():
        await store.delete_object("gone", if_generation_match=generation)

    run_with_workers(store, main)
    assert killed and emulator.object_info(FLAT_BUCKET, "gone") is None


def test_a_delete_made_again_never_touches_a_newer_generation(emulator, make_store):
    """The first attempt was refused? No: it deleted; meanwhile another writer made
    the name again. The retry's precondition keeps theirs: ESTALE, not success."""
    generation = emulator.seed(FLAT_BUCKET, "f", b"mine")
    store = make_store(FLAT_BUCKET)
    original = emulator.store.delete_object
    killed = kill_after(emulator, store, "delete_object")
    wrapped = emulator.store.delete_object

    def theirs_after(*args, **kwargs):
        result = wrapped(*args, **kwargs)
        emulator.store.delete_object = original
        emulator.seed(FLAT_BUCKET, "f", b"theirs")
        return result

    emulator.store.delete_object = theirs_after

    async def main():
        with pytest.raises(StorageError) as refused:
            await store.delete_object("f", if_generation_match=generation)
        return refused.value.errno

    assert run_with_workers(store, main) == errno.ESTALE
    assert killed and emulator.read_object(FLAT_BUCKET, "f") == b"theirs"


@pytest.mark.parametrize("bucket", [ZONAL_BUCKET, FLAT_BUCKET])
def test_a_move_made_again_after_its_worker_died_returns_the_moved_object(emulator, make_store, bucket):
    generation = emulator.seed(bucket, "src", b"moving")
    store = make_store(bucket)
    killed = kill_after(emulator, store, "move_object")

    async def main():
        return await store.move_object("src", "dst", if_source_generation_match=generation, if_generation_match=0)

    moved = run_with_workers(store, main)
    assert killed and moved.name == "dst" and moved.size == 6
    assert emulator.object_info(bucket, "src") is None and emulator.read_object(bucket, "dst") == b"moving"


def test_a_metadata_update_made_again_after_its_worker_died_succeeds(emulator, make_store):
    generation = emulator.seed(ZONAL_BUCKET, "m", b"x")
    store = make_store(ZONAL_BUCKET)
    killed = kill_after(emulator, store, "update_object")

    async def main():
        meta = await store.get_object("m")
        return meta, await store.update_metadata("m", generation, {"mode": "100600"},
                                                 if_metageneration_match=meta.metageneration)

    before, after = run_with_workers(store, main)
    assert killed and after.metageneration == before.metageneration + 1 and after.metadata["mode"] == "100600"


def test_an_upload_made_again_after_its_worker_died_returns_its_own_generation(emulator, make_store):
    emulator.seed(FLAT_BUCKET, "w", b"old")
    old = emulator.object_info(FLAT_BUCKET, "w")["generation"]
    store = make_store(FLAT_BUCKET)
    data = os.urandom(3 << 20)
    fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR)
    os.write(fd, data)
    killed = kill_after(emulator, store, "commit_upload")

    async def main():
        return await store.write_object("w", fd, len(data), if_generation_match=old)

    try:
        meta = run_with_workers(store, main)
    finally:
        os.close(fd)
    assert killed and meta.generation != old and meta.size == len(data)
    assert emulator.read_object(FLAT_BUCKET, "w") == data
    assert emulator.object_info(FLAT_BUCKET, "w")["generation"] == meta.generation


def test_a_staged_file_appended_by_a_worker_that_dies_is_appended_whole_by_another(emulator, make_store):
    """On a zonal bucket a staged upload appends from the staged file, which
    the worker reads itself. Its worker dies after the bucket persisted part
    of it: another worker takes the object over at its persisted size and
    reads the rest of the file, through the descriptor passed again."""
    store = make_store(ZONAL_BUCKET)
    data = os.urandom(12 << 20)  # past --write-buffer: the first worker persists some of it
    fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR)
    os.write(fd, data)
    killed = kill_after(emulator, store, "append")

    async def main():
        appender = store.open_appender("staged.bin")
        await appender.create(if_generation_match=0)
        await appender.append_file(fd, len(data))
        return await appender.finalize()

    try:
        meta = run_with_workers(store, main)
    finally:
        os.close(fd)
    assert killed and meta.finalized and meta.size == len(data)
    assert emulator.read_object(ZONAL_BUCKET, "staged.bin") == data
    assert store.stream_events.write["reconnect"] >= 1


def test_a_create_made_again_after_its_worker_died_takes_its_own_object_over(emulator, make_store):
    store = make_store(ZONAL_BUCKET)
    killed = kill_after(emulator, store, "create_appendable")

    async def main():
        appender = store.open_appender("new.log")
        meta = await appender.create(if_generation_match=0)
        await appender.append(b"after the loss")
        assert await appender.flush() == 14
        await appender.close()
        return meta

    meta = run_with_workers(store, main)
    info = emulator.object_info(ZONAL_BUCKET, "new.log")
    assert killed and info["generation"] == meta.generation
    assert emulator.read_object(ZONAL_BUCKET, "new.log") == b"after the loss"


def test_a_create_never_adopts_another_writers_object(emulator, make_store):
    """The name holds bytes of another writer (or an older object): EEXIST's ESTALE."""
    store = make_store(ZONAL_BUCKET)
    original = emulator.store.create_appendable

    def theirs_instead(bucket, name, *args, **kwargs):
        record = original(bucket, name, *args, **kwargs)
        emulator.store.append(bucket, name, record.generation, record.writer_epoch, 0, b"theirs")
        return record

    emulator.store.create_appendable = theirs_instead
    killed = kill_after(emulator, store, "create_appendable")

    async def main():
        with pytest.raises(StorageError) as refused:
            await store.open_appender("taken.log").create(if_generation_match=0)
        return refused.value.errno

    assert run_with_workers(store, main) == errno.ESTALE
    assert killed and emulator.read_object(ZONAL_BUCKET, "taken.log") == b"theirs"


def test_a_takeover_made_again_after_its_worker_died_succeeds(emulator, make_store):
    generation = emulator.seed(ZONAL_BUCKET, "t.log", b"0123", finalize=False)
    store = make_store(ZONAL_BUCKET)
    killed = kill_after(emulator, store, "open_appendable")

    async def main():
        appender = store.open_appender("t.log")
        assert await appender.takeover(generation) == 4
        await appender.append(b"4567")
        await appender.flush()
        await appender.close()

    run_with_workers(store, main)
    assert killed and emulator.read_object(ZONAL_BUCKET, "t.log") == b"01234567"


def test_folder_changes_made_again_after_their_worker_died_succeed(emulator, make_store):
    store = make_store(HNS_BUCKET)
    killed = kill_after(emulator, store, "create_folder", times=3)
    kill_after(emulator, store, "rename_folder")
    kill_after(emulator, store, "delete_folder")

    async def main():
        await store.create_folder("a/")
        await store.rename_folder("a/", "z/")
        assert stat_bools(await store.stat_name("z")) == (None, True)
        await store.delete_folder("z/")
        assert stat_bools(await store.stat_name("z")) == (None, False)

    run_with_workers(store, main)
    assert killed
