"""The data-plane workers through a real mount: how many, what a SIGKILL of
one does to a large read and to appends with fsync, what happens to a worker
that hangs (SIGSTOP: alive, silent), what happens to one past
--worker-memory-limit, and that they never outlive the mount."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time

import pytest

from rapidmount.daemon.config import default_workers
from rapidmount.emulator import Emulator
from tests.mountutil import mounted, payload
from tests.polling import until

MiB = 1 << 20
BUCKET = "workers-bucket"
BIG = 1024 * MiB


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


def test_worker_count_follows_the_flag_and_the_cores(emu):
    with mounted(emu.endpoint, BUCKET, "--workers", "3") as m:
        until(lambda: len(m.worker_pids()) == 3, what="3 workers")
    with mounted(emu.endpoint, BUCKET) as m:
        until(lambda: len(m.worker_pids()) == default_workers(), what="the default workers")
        assert "data-plane worker" in m.log()


def _maps_jemalloc(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return "libjemalloc" in maps.read()


@pytest.mark.parametrize("choice, expected", [("auto", True), ("jemalloc", True), ("glibc", False)])
def test_workers_run_on_the_allocator_asked_for(emu, choice, expected):
    """make system-deps installs libjemalloc2, so auto means jemalloc here;
    the FUSE process keeps glibc's malloc either way."""
    with mounted(emu.endpoint, BUCKET, "--workers", "1", "--worker-allocator", choice) as m:
        (pid,) = until(lambda: m.worker_pids() or None, what="a worker")
        data = payload(4 * MiB, 7)
        (m.path / f"alloc-{choice}").write_bytes(data)
        assert (m.path / f"alloc-{choice}").read_bytes() == data
        assert _maps_jemalloc(pid) is expected
        assert not _maps_jemalloc(m.pid)


def test_a_worker_killed_during_a_1_gib_read_loses_no_byte(emu):
    data = b"".join(payload(64 * MiB, 31 + i) for i in range(BIG // (64 * MiB)))
    emu.seed(BUCKET, "big.bin", data)
    expected = hashlib.sha256(data).hexdigest()
    del data
    with mounted(emu.endpoint, BUCKET, "--workers", "2", "--read-streams", "4") as m:
        until(lambda: len(m.worker_pids()) == 2, what="2 workers")
        victim = m.worker_pids()[0]
        digest = hashlib.sha256()
        read = 0
        with open(m.path / "big.bin", "rb", buffering=0) as f:
            while chunk := f.read(MiB):
                digest.update(chunk)
                read += len(chunk)
                if read == 256 * MiB:
                    os.kill(victim, signal.SIGKILL)
        assert read == BIG and digest.hexdigest() == expected
        assert "exited with SIGKILL; starting another" in m.log()
        until(lambda: len(m.worker_pids()) == 2 and victim not in m.worker_pids(), what="a replacement")


def test_appends_with_fsync_survive_every_worker_killed(emu):
    """Each fsync that succeeded is in the bucket; after SIGKILL of every
    worker mid-stream the object is still exactly what was written."""
    pieces = [payload(MiB + 4099, 100 + i) for i in range(24)]
    with mounted(emu.endpoint, BUCKET, "--workers", "2") as m:
        until(lambda: len(m.worker_pids()) == 2, what="2 workers")
        fd = os.open(m.path / "appended.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        written = b""
        try:
            for index, piece in enumerate(pieces):
                os.write(fd, piece)
                written += piece
                if index % 4 == 3:
                    os.fsync(fd)
                    stored = emu.read_object(BUCKET, "appended.log")
                    assert stored[:len(written)] == written and len(stored) >= len(written)
                if index in (5, 14):
                    for pid in m.worker_pids():
                        os.kill(pid, signal.SIGKILL)
            os.fsync(fd)
        finally:
            os.close(fd)
        assert emu.read_object(BUCKET, "appended.log") == written
        # The second round may catch the replacements still starting.
        assert m.log().count("exited with SIGKILL; starting another") >= 2


HANG_FLAGS = ("--workers", "2", "--stall-timeout", "3")


def _both_workers_serving(m) -> list[int]:
    """The two workers' pids once both answer calls (the heartbeat watches only those)."""
    until(lambda: len(m.worker_pids()) == 2 and all(f"data-plane worker {index} started" in m.log()
                                                         for index in (0, 1)), what="2 workers serving")
    return m.worker_pids()


def test_a_hung_worker_is_killed_and_the_read_goes_on(emu):
    """Before the heartbeat, a worker that hung without dying hung its reads for good."""
    data = payload(192 * MiB, 77)
    emu.seed(BUCKET, "hang-read.bin", data)
    with mounted(emu.endpoint, BUCKET, *HANG_FLAGS, "--read-streams", "4") as m:
        victim = _both_workers_serving(m)[0]
        got = bytearray()
        try:
            with open(m.path / "hang-read.bin", "rb", buffering=0) as f:
                while chunk := f.read(MiB):
                    got += chunk
                    if len(got) == 32 * MiB:
                        os.kill(victim, signal.SIGSTOP)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
        assert got == data
        assert "did not answer for 3s; killing it" in m.log()
        until(lambda: len(m.worker_pids()) == 2 and victim not in m.worker_pids(), what="a replacement")


def test_appends_with_fsync_survive_every_worker_hanging(emu):
    pieces = [payload(MiB + 511, 300 + i) for i in range(12)]
    with mounted(emu.endpoint, BUCKET, *HANG_FLAGS) as m:
        serving = _both_workers_serving(m)
        stopped: list[int] = []
        fd = os.open(m.path / "hang-appended.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        written = b""
        try:
            for index, piece in enumerate(pieces):
                os.write(fd, piece)
                written += piece
                if index == 4:
                    stopped = serving
                    for pid in stopped:
                        os.kill(pid, signal.SIGSTOP)
                if index % 3 == 2:
                    os.fsync(fd)
                    assert emu.read_object(BUCKET, "hang-appended.log")[:len(written)] == written
            os.fsync(fd)
        finally:
            os.close(fd)
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        assert emu.read_object(BUCKET, "hang-appended.log") == written
        until(lambda: m.log().count("did not answer for 3s; killing it") == 2, what="both hung workers killed")
        until(lambda: len(m.worker_pids()) == 2 and not set(stopped) & set(m.worker_pids()),
                  what="two replacements")


def test_a_worker_past_its_memory_limit_is_replaced_and_the_read_goes_on(emu):
    """--worker-memory-limit bounds what a worker's heap keeps: a worker that
    holds more is replaced like a crashed one, and its reads are made again."""
    data = b"".join(payload(64 * MiB, 91 + i) for i in range(6))
    emu.seed(BUCKET, "limit-read.bin", data)
    expected = hashlib.sha256(data).hexdigest()
    del data
    replaced = "past --worker-memory-limit (32 MiB); replacing it"
    # A small cache and dropped kernel pages: every pass comes from the worker.
    with mounted(emu.endpoint, BUCKET, "--workers", "1", "--read-streams", "4", "--cache-size", "32M",
                 "--worker-memory-limit", "32M") as m:
        until(lambda: "data-plane worker 0 started" in m.log(), what="the worker serving")
        first = m.worker_pids()
        deadline = time.monotonic() + 60
        passes = 0
        while replaced not in m.log() and time.monotonic() < deadline:
            digest = hashlib.sha256()
            with open(m.path / "limit-read.bin", "rb", buffering=0) as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                while chunk := f.read(MiB):
                    digest.update(chunk)
            passes += 1
            assert digest.hexdigest() == expected, f"pass {passes} returned other bytes"
        assert replaced in m.log(), f"no worker replaced in {passes} passes"
        until(lambda: len(m.worker_pids()) == 1 and not set(first) & set(m.worker_pids()), what="a replacement")


def test_workers_do_not_outlive_a_daemon_killed_with_sigkill(emu):
    with mounted(emu.endpoint, BUCKET, "--workers", "2") as m:
        until(lambda: len(m.worker_pids()) == 2, what="2 workers")
        workers = m.worker_pids()
        os.kill(m.pid, signal.SIGKILL)
        m.process.wait()

        def all_gone() -> bool:
            return not any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in workers)
        until(all_gone, timeout=10, what="the workers to exit")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
