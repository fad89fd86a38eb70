"""Reads under injected faults: exact bytes and no application error, or EIO
within the retry deadline for a persistent outage. Also the memory budget."""

from __future__ import annotations

import errno
import os
import random
import threading
import time

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import mounted

MiB = 1 << 20
BUCKET = "fault-bucket"


@pytest.fixture(scope="module")
def objects():
    return {f"obj-{i}": random.Random(i).randbytes(24 * MiB + i * 4099) for i in range(4)}


@pytest.fixture(scope="module")
def emu(objects):
    with Emulator(buckets={BUCKET: "zonal"}, seed=1234) as emulator:
        for name, data in objects.items():
            emulator.seed(BUCKET, name, data)
        yield emulator


@pytest.fixture(scope="module")
def mount(emu):
    # A small cache so every test really reads from the stream.
    with mounted(emu.endpoint, BUCKET, "--retry-deadline", "8", "--cache-size", "8MiB") as m:
        yield m


def _read_all_direct(path) -> bytes:
    """Read through O_DIRECT so the kernel page cache can't hide the stream."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        chunks = []
        while chunk := os.read(fd, MiB):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@pytest.mark.parametrize("fault", [
    "broken-read:after=3000000,count=3",
    "unavailable:rate=0.3,method=BidiReadObject,count=6",
    "redirect-read:count=2",
    "corrupt-read:rate=0.2,count=4",
])
def test_reads_survive_faults_byte_exact(mount, emu, objects, fault):
    emu.clear_faults()
    emu.add_fault(fault)
    try:
        for name, data in objects.items():
            assert _read_all_direct(mount.path / name) == data, f"{name} under {fault}"
    finally:
        emu.clear_faults()
    log = mount.log()
    if fault.startswith(("broken", "corrupt", "unavailable")):
        assert "resuming in" in log


def test_random_reads_survive_broken_streams(mount, emu, objects):
    data = objects["obj-1"]
    emu.add_fault("broken-read:after=1500000,count=5")
    try:
        rng = random.Random(3)
        fd = os.open(mount.path / "obj-1", os.O_RDONLY | os.O_DIRECT)
        try:
            for _ in range(200):
                offset = rng.randrange(0, len(data) - 1)
                length = rng.choice([4096, 65536, MiB])
                assert os.pread(fd, length, offset) == data[offset:offset + length]
        finally:
            os.close(fd)
    finally:
        emu.clear_faults()


def test_persistent_outage_gives_eio_within_deadline(mount, emu, objects):
    assert os.stat(mount.path / "obj-2").st_size == len(objects["obj-2"])
    emu.add_fault("outage")
    fd = os.open(mount.path / "obj-2", os.O_RDONLY | os.O_DIRECT)  # attributes are cached
    try:
        started = time.monotonic()
        with pytest.raises(OSError) as info:
            os.pread(fd, MiB, 5 * MiB)
        elapsed = time.monotonic() - started
        assert info.value.errno == errno.EIO
        assert elapsed < 8 + 10, f"EIO took {elapsed:.1f}s with an 8s deadline"
    finally:
        emu.clear_faults()
        os.close(fd)
    # And the mount recovers once the service is back.
    assert _read_all_direct(mount.path / "obj-2") == objects["obj-2"]


def test_cache_budget_holds_with_64_handles(emu, objects):
    """64 handles reading at once stay within the cache budget (daemon RSS)."""
    budget = 64 * MiB
    with mounted(emu.endpoint, BUCKET, "--cache-size", "64MiB", "--readahead-max", "32MiB") as m:
        # Warm the daemon up so that its baseline includes imports and threads.
        _read_all_direct(m.path / "obj-0")
        baseline = m.rss_bytes()
        peak = baseline
        stop = threading.Event()
        errors: list[str] = []

        def reader(index: int) -> None:
            name = f"obj-{index % 4}"
            try:
                with open(m.path / name, "rb") as f:
                    if f.read() != objects[name]:
                        errors.append(f"mismatch in {name}")
            except OSError as err:
                errors.append(repr(err))

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, m.rss_bytes())
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        stop.set()
        sampler.join()
        assert errors == []
        growth = peak - baseline
        # The page cache may hold its budget; streams and gRPC buffers add a
        # little on top, but nothing proportional to 64 x the readahead window.
        assert growth < budget + 96 * MiB, f"RSS grew by {growth / MiB:.0f} MiB with a {budget / MiB:.0f} MiB budget"
