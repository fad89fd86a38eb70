"""Appends through a real mount whose large writes stay in the FUSE process:
the workers read them from its memory (process_vm_readv) and the bucket
gets exactly the bytes written; where the workers cannot read it, the arena
carries them as before; a worker killed in the middle of a large append
loses no byte."""

from __future__ import annotations

import os
import random
import signal

import pytest

from rapidmount.shared.peer_memory import DISABLE_ENV
from rapidmount.emulator import Emulator
from tests.mountutil import mounted, payload, write_all
from tests.polling import until

KiB = 1 << 10
MiB = 1 << 20
BUCKET = "held-bucket"
READ_HERE = "data-plane workers read written bytes straight from this process's memory"
COPIED = "written bytes are copied into the shared arena"


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


def _write_mixed(path, seed: int) -> bytes:
    """Large and small writes mixed (each one write(2)), then close; what was written."""
    rng = random.Random(seed)
    sizes = [MiB, 100, 200 * KiB, 5 * KiB, 3 * MiB + 1, 64 * KiB, 64 * KiB - 1, 1, 2 * MiB]
    sizes += [rng.choice((rng.randrange(1, 64 * KiB), rng.randrange(64 * KiB, 2 * MiB))) for _ in range(30)]
    written = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for size in sizes:
            data = rng.randbytes(size)
            write_all(fd, data)
            written.append(data)
    finally:
        os.close(fd)
    return b"".join(written)


def test_large_writes_are_read_from_the_fuse_process_and_land_exactly(emu):
    with mounted(emu.endpoint, BUCKET, "--workers", "2") as m:
        written = _write_mixed(m.path / "mixed.bin", 1)
        assert emu.read_object(BUCKET, "mixed.bin") == written
        assert (m.path / "mixed.bin").read_bytes() == written
        log = m.log()
        assert log.count(READ_HERE) == 1 and COPIED not in log


def test_where_workers_cannot_read_the_fuse_process_the_arena_carries_appends(emu):
    with mounted(emu.endpoint, BUCKET, "--workers", "2", env={**os.environ, DISABLE_ENV: "1"}) as m:
        written = _write_mixed(m.path / "arena.bin", 2)
        assert emu.read_object(BUCKET, "arena.bin") == written
        log = m.log()
        assert log.count(COPIED) == 1 and f"turned off by {DISABLE_ENV}" in log and READ_HERE not in log


def test_a_worker_killed_in_the_middle_of_a_large_append_loses_no_byte(emu):
    """Every worker killed twice while 96 MiB go out in 1 MiB writes, with no
    fsync in between: the FUSE process kept every unconfirmed write, and the
    replacements read them again from it."""
    pieces = [payload(MiB, 500 + i) for i in range(96)]
    with mounted(emu.endpoint, BUCKET, "--workers", "2") as m:
        until(lambda: len(m.worker_pids()) == 2, what="2 workers")
        fd = os.open(m.path / "killed.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for index, piece in enumerate(pieces):
                write_all(fd, piece)
                if index in (20, 60):
                    for pid in m.worker_pids():
                        os.kill(pid, signal.SIGKILL)
            os.fsync(fd)
        finally:
            os.close(fd)
        assert emu.read_object(BUCKET, "killed.bin") == b"".join(pieces)
        assert m.log().count("exited with SIGKILL; starting another") >= 2
        assert READ_HERE in m.log()
