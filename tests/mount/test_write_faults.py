"""Writes when things go wrong: the daemon killed with SIGKILL after fsync,
broken, redirected and refused write streams, an outage, and backpressure.

The promise under test: a byte acknowledged by fsync is in the bucket, and
what the bucket holds is always a prefix of what was written, in order.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import threading
import time

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard, write_all
from tests.mountutil import payload, errno_name
from tests.polling import until

MiB = 1 << 20
BUCKET = "wfault-bucket"  # zonal
HNS = "wfault-hns"
KILL_TRIALS = 20
TEST_TIME_LIMIT = 90.0  # per test; past it the daemons are killed so the test fails instead of hanging


# ---------------------------------------------------------------- helpers

_GUARD = HangGuard(TEST_TIME_LIMIT)
_mount = _GUARD.mount
_hang_guard = _GUARD.autouse_fixture()


def _persisted(emu: Emulator, bucket: str, name: str) -> bytes:
    return emu.read_object(bucket, name) if emu.object_info(bucket, name) is not None else b""


def _for_object(spec: str, name: str) -> str:
    """``spec`` restricted to one object (the fault grammar's object= option)."""
    return f"{spec}{',' if ':' in spec else ':'}object={name}"


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal", HNS: "hns"}, seed=4321) as emulator:
        for folder in ("kill/", "faults/", "staged/", "outage/", "backpressure/"):
            emulator.store.create_folder(BUCKET, folder)
        emulator.store.create_folder(HNS, "staged/")
        yield emulator


@pytest.fixture(autouse=True)
def _no_leftover_faults(emu):
    emu.clear_faults()
    emu.set_latency(0)
    yield
    emu.clear_faults()
    emu.set_latency(0)


@pytest.fixture(scope="module")
def mount(emu):
    with _mount(emu, BUCKET, "--retry-deadline", "20") as m:
        yield m


# ---------------------------------------------------------------- kill -9

@pytest.mark.parametrize("trial", range(KILL_TRIALS))
def test_fsynced_bytes_survive_kill_9(emu, trial):
    """Random writes with fsync/fdatasync at random points, then SIGKILL of
    the daemon: every synced byte is in the bucket, in order, and anything
    beyond is a prefix of the rest of what was written."""
    rng = random.Random(0x5EED_0000 + trial)
    name = f"kill/trial-{trial:02d}.bin"
    takeover = trial % 3 == 2  # some trials append to an existing unfinalized object
    written = b""  # everything write() accepted, in order
    synced = 0  # bytes acknowledged by fsync/fdatasync
    if takeover:
        written = rng.randbytes(rng.randint(1, 200_000))
        emu.seed(BUCKET, name, written, finalize=False)
        synced = len(written)
    target = rng.randint(4_000, 3 * MiB)
    with _mount(emu, BUCKET, "--retry-deadline", "20") as m:
        flags = os.O_WRONLY | (os.O_APPEND if takeover else os.O_CREAT | os.O_EXCL)
        fd = os.open(m.path / name, flags, 0o644)
        try:
            wrote_in_trial = 0
            synced_in_trial = False
            while wrote_in_trial < target:
                size = min(rng.choice([1, 100, 4096, 65_536, 300_000, MiB]), target - wrote_in_trial)
                chunk = rng.randbytes(size)
                write_all(fd, chunk)
                written += chunk
                wrote_in_trial += size
                if rng.random() < 0.3:
                    (os.fsync if rng.random() < 0.5 else os.fdatasync)(fd)
                    synced, synced_in_trial = len(written), True
            if not synced_in_trial:
                os.fsync(fd)
                synced = len(written)
            if rng.random() < 0.6:  # unsynced bytes at the time of the kill
                extra = rng.randbytes(rng.randint(1, 500_000))
                write_all(fd, extra)
                written += extra
            os.kill(m.pid, signal.SIGKILL)
            m.process.wait(timeout=30)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)  # ENOTCONN: the daemon is gone
    persisted = _persisted(emu, BUCKET, name)
    assert len(persisted) >= synced, f"lost synced bytes: {len(persisted)} persisted, {synced} synced"
    assert persisted == written[:len(persisted)], "the object is not a prefix of what was written"


# ---------------------------------------------------------------- broken, redirected, refused streams

# fault specs, and how many extra BidiWriteObject calls they cause at least
STREAM_FAULTS = {
    "broken-once": (["broken-write:after=3000000"], 1),
    "broken-thrice": (["broken-write:after=1000000,count=3"], 3),
    "redirect": (["redirect-write"], 1),
    "unavailable-opens": (["unavailable:method=BidiWriteObject,count=3"], 3),
    "mixed": (["redirect-write", "broken-write:after=1500000,count=2",
               "unavailable:method=BidiWriteObject,rate=0.5,count=3"], 3),
}


@pytest.mark.parametrize("how", ["create", "append"])
@pytest.mark.parametrize("case", list(STREAM_FAULTS))
def test_streamed_writes_survive_stream_faults(mount, emu, case, how):
    specs, extra_calls = STREAM_FAULTS[case]
    name = f"faults/{case}-{how}.bin"
    head = b""
    generation = None
    if how == "append":
        head = payload(123_457, 1)
        generation = emu.seed(BUCKET, name, head, finalize=False)
    data = payload(6 * MiB + 333, 2)
    for spec in specs:
        emu.add_fault(_for_object(spec, name))
    emu.reset_rpc_counts()
    path = mount.path / name
    flags = os.O_WRONLY | (os.O_APPEND if how == "append" else os.O_CREAT | os.O_EXCL)
    fd = os.open(path, flags, 0o644)
    try:
        for offset in range(0, len(data), 512 * 1024):
            write_all(fd, data[offset:offset + 512 * 1024])
            if offset == 3 * MiB:
                os.fsync(fd)
                assert _persisted(emu, BUCKET, name) == head + data[:offset + 512 * 1024]
    finally:
        os.close(fd)
    emu.clear_faults()
    assert _persisted(emu, BUCKET, name) == head + data, f"not byte-exact after close under {specs}"
    info = emu.object_info(BUCKET, name)
    assert info["finalized"] is False
    if generation is not None:
        assert info["generation"] == generation, "the stream must resume the object, not replace it"
    calls = emu.rpc_counts.get("BidiWriteObject", 0)
    assert calls >= 1 + extra_calls, f"the faults did not fire ({calls} BidiWriteObject calls)"
    assert os.stat(path).st_size == len(head) + len(data)


@pytest.fixture(scope="module")
def hns_mount(emu):
    with _mount(emu, HNS, "--retry-deadline", "20") as m:
        yield m


@pytest.mark.parametrize("where", ["zonal", "hns"])
def test_staged_upload_survives_a_broken_stream(mount, hns_mount, emu, where):
    """A staged upload (random writes) is retried whole when its stream breaks."""
    bucket, m = (BUCKET, mount) if where == "zonal" else (HNS, hns_mount)
    name = f"staged/{where}.bin"
    base = payload(3 * MiB + 5, 3)
    emu.seed(bucket, name, base)
    expected = bytearray(base)
    emu.add_fault(f"broken-write:after=1000000,object={name}")
    fd = os.open(m.path / name, os.O_RDWR)
    try:
        for offset in (10, 2 * MiB, len(base) - 3):
            os.pwrite(fd, b"patch", offset)
            expected[offset:offset + 5] = b"patch"
    finally:
        os.close(fd)
    assert emu.read_object(bucket, name) == bytes(expected)
    if where == "hns":
        assert emu.object_info(bucket, name)["finalized"] is True


# ---------------------------------------------------------------- outage: EIO, bounded

@pytest.mark.parametrize("reported_at", ["fsync", "close"])
def test_persistent_failure_is_eio_within_the_retry_deadline(emu, reported_at):
    """fsync, or close (flush), of bytes that cannot be persisted fails with
    EIO once --retry-deadline has passed; what the bucket has is a prefix."""
    name = f"outage/{reported_at}.bin"
    deadline_s = 3
    prefix = b"x" * 4096
    data = payload(MiB, 4)
    with _mount(emu, BUCKET, "--retry-deadline", str(deadline_s)) as m:
        fd = os.open(m.path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        closed = False
        try:
            write_all(fd, prefix)
            os.fsync(fd)  # the stream is up
            # The stream breaks 100000 bytes in, and every reconnect is refused.
            emu.add_fault(f"broken-write:after=100000,object={name}")
            emu.add_fault("outage")
            started = time.monotonic()
            with pytest.raises(OSError) as info:
                write_all(fd, data)
                if reported_at == "fsync":
                    os.fsync(fd)
                else:
                    closed = True
                    os.close(fd)
            elapsed = time.monotonic() - started
            assert info.value.errno == errno.EIO, f"expected EIO, got {errno_name(info.value.errno)}"
            assert elapsed < deadline_s + 15, f"EIO took {elapsed:.1f}s with a {deadline_s}s deadline"
        finally:
            emu.clear_faults()
            if not closed:
                try:
                    os.close(fd)
                except OSError as err:
                    assert err.errno == errno.EIO, f"close after the failure: {errno_name(err.errno)}"
    persisted = _persisted(emu, BUCKET, name)
    assert len(persisted) >= len(prefix), "the bytes synced before the outage were lost"
    assert persisted == (prefix + data)[:len(persisted)]


# ---------------------------------------------------------------- backpressure

def test_write_waits_once_the_write_buffer_is_full(emu):
    """With the stream stuck, write() accepts at most --write-buffer bytes
    beyond what the bucket has, then blocks; it resumes when the stream does."""
    limit = 4 * MiB
    name = "backpressure/bp.bin"
    data = payload(24 * MiB, 5)
    with _mount(emu, BUCKET, "--write-buffer", "4MiB", "--retry-deadline", "30") as m:
        fd = os.open(m.path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        accepted = 0
        failure: list[BaseException] = []

        prefix = 4096

        def writer() -> None:
            nonlocal accepted
            try:
                for offset in range(prefix, len(data), 256 * 1024):
                    write_all(fd, data[offset:offset + 256 * 1024])
                    accepted = min(offset + 256 * 1024, len(data))
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)

        try:
            write_all(fd, data[:prefix])
            os.fsync(fd)  # the stream is up
            accepted = prefix
            stuck_at = MiB  # counted from the start of the stream, prefix included
            emu.add_fault(f"broken-write:after={stuck_at},object={name}")
            emu.add_fault(f"unavailable:method=BidiWriteObject,object={name},count=inf")
            thread = threading.Thread(target=writer, daemon=True)
            thread.start()
            until(lambda: _persisted_size(emu, name) >= stuck_at or not thread.is_alive(), 20, "the stream's break")
            assert _persisted_size(emu, name) == stuck_at, "the stream did not get stuck as planned"
            # The writer fills the buffer; then, while the mount tries the stuck stream
            # twice more, a write() without backpressure would run on to the end.
            until(lambda: accepted - stuck_at >= limit - MiB or not thread.is_alive(), 30, "the buffer filling")
            attempts = emu.rpc_counts.get("BidiWriteObject", 0)
            until(lambda: emu.rpc_counts.get("BidiWriteObject", 0) >= attempts + 2 or not thread.is_alive(), 20,
                  "two more attempts at the stuck stream")
            ahead = accepted - stuck_at
            assert thread.is_alive(), f"write() never waited: all {accepted} bytes accepted ({failure})"
            assert ahead <= limit + MiB, f"write() accepted {ahead} bytes beyond the bucket with a {limit} buffer"
            emu.clear_faults()
            thread.join(timeout=60)
            assert not thread.is_alive(), "write() did not resume after the stream recovered"
            assert not failure, f"write() failed: {failure[0]!r}"
            os.fsync(fd)
        finally:
            emu.clear_faults()
            with contextlib.suppress(OSError):
                os.close(fd)
    assert emu.read_object(BUCKET, name) == data


def _persisted_size(emu: Emulator, name: str) -> int:
    info = emu.object_info(BUCKET, name)
    return info["size"] if info else 0
