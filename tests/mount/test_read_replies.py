"""The data-plane workers write the replies of large READs themselves.

Real mounts over real gRPC. What each test holds the mount to: exact bytes
through read(), mmap and O_DIRECT with the replies written by workers (and
small ones by the FUSE process); every reply by the FUSE process with
``--no-worker-replies``; no read lost, torn or hung when workers are killed
while they answer, or when readers are killed while their READs are answered.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import random
import signal
import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rapidmount.emulator import Emulator
from tests.mountutil import mounted, payload
from tests.polling import io_bytes, until
from tests.reliability.test_r4_many_handles import _free_port

KiB, MiB = 1 << 10, 1 << 20
BUCKET = "read-replies-bucket"


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


def _replies(port: int) -> dict[str, float]:
    """READ replies by who wrote them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.labels["by"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "rapidmount_read_replies_total"}


def _answered(replies: dict[str, float]) -> float:
    return sum(replies.values())


def _by_workers(replies: dict[str, float]) -> float:
    """Replies a worker wrote: from the arena, or as the bytes landed."""
    return replies.get("worker", 0) + replies.get("landed", 0)


def _mount(emu: Emulator, *extra: str):
    port = _free_port()
    return mounted(emu.endpoint, BUCKET, "--prometheus-port", str(port), *extra), port


def _direct_reads(path, data: bytes, size: int, offsets) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buffer = mmap.mmap(-1, size)
    try:
        for offset in offsets:
            count = os.preadv(fd, [buffer], offset)
            assert count == min(size, len(data) - offset)
            assert buffer[:count] == data[offset:offset + count], f"wrong bytes at {offset}"
    finally:
        os.close(fd)
        buffer.close()


def test_large_reads_are_answered_by_workers_with_exact_bytes_and_small_ones_here(emu):
    data = payload(32 * MiB + 12345, seed=31)
    emu.seed(BUCKET, "exact.bin", data)
    context, port = _mount(emu, "--page-store-buffer", "0")
    with context as mount:
        path = mount.path / "exact.bin"
        with open(path, "rb") as f:
            assert f.read() == data
        subprocess.run(["sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"], check=False)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            assert hashlib.sha256(mapped).digest() == hashlib.sha256(data).digest()
        _direct_reads(path, data, 1 * MiB, range(0, len(data), 1 * MiB))
        replies = _replies(port)
        assert replies["worker"] >= 33, replies  # the O_DIRECT pass alone
        small = replies["fuse"]
        _direct_reads(path, data, 4 * KiB, range(4 * KiB, 8 * MiB, 256 * KiB))
        after = _replies(port)
        assert after["fuse"] - small >= 32 and after["worker"] == replies["worker"], after


def test_through_the_reference_loop_reads_are_exact_and_no_worker_writes_a_reply(emu):
    data = payload(16 * MiB, seed=35)
    emu.seed(BUCKET, "through-pyfuse3.bin", data)
    context, port = _mount(emu, "--page-store-buffer", "0", "--pyfuse3-requests")
    with context as mount:
        path = mount.path / "through-pyfuse3.bin"
        _direct_reads(path, data, 1 * MiB, range(0, len(data), 1 * MiB))
        with open(path, "rb") as f:
            assert f.read() == data
        replies = _replies(port)
        assert _answered(replies) == 0, replies  # pyfuse3 wrote every reply: none counted by the own loop
        assert "pyfuse3 request loop" in mount.log()


def test_with_no_worker_replies_the_fuse_process_writes_every_reply(emu):
    data = payload(8 * MiB, seed=32)
    emu.seed(BUCKET, "local.bin", data)
    context, port = _mount(emu, "--no-worker-replies")
    with context as mount:
        path = mount.path / "local.bin"
        with open(path, "rb") as f:
            assert f.read() == data
        _direct_reads(path, data, 1 * MiB, range(0, len(data), 1 * MiB))
        replies = _replies(port)
        assert replies["worker"] == 0 and replies["fuse"] >= 8, replies


def test_workers_killed_while_they_answer_reads_cost_no_read_and_hang_none(emu):
    data = payload(24 * MiB, seed=33)
    emu.seed(BUCKET, "killed.bin", data)
    context, port = _mount(emu, "--workers", "2", "--page-store-buffer", "0")
    with context as mount:
        path = mount.path / "killed.bin"
        problems: list[str] = []
        passes = [0]
        stop = threading.Event()

        def reader() -> None:
            try:
                while not stop.is_set():
                    _direct_reads(path, data, 1 * MiB, range(0, len(data), 1 * MiB))
                    passes[0] += 1
            except (AssertionError, OSError) as err:
                problems.append(repr(err))

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        killed = 0
        deadline = time.monotonic() + 90
        while killed < 6 and time.monotonic() < deadline and thread.is_alive():
            workers = mount.worker_pids()
            if len(workers) == 2 and _by_workers(_replies(port)) > 0:
                os.kill(workers[killed % 2], signal.SIGKILL)
                killed += 1
            time.sleep(0.4)
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "a read hung after its worker was killed"
        assert not problems, problems
        assert killed == 6 and passes[0] >= 1
        with open(path, "rb") as f:
            assert f.read() == data


def test_readers_killed_while_their_reads_are_answered_leave_the_mount_answering(emu):
    data = payload(64 * MiB, seed=34)
    emu.seed(BUCKET, "interrupted.bin", data)
    context, port = _mount(emu, "--page-store-buffer", "0")
    with context as mount:
        path = mount.path / "interrupted.bin"
        for round_ in range(8):
            dd = subprocess.Popen(["dd", f"if={path}", "of=/dev/null", "bs=8M", "iflag=direct"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Killed after 1 to 4 of its reads, with the next in flight.
            until(lambda: io_bytes(dd.pid, "rchar") >= (round_ % 4 + 1) * 8 * MiB or dd.poll() is not None,
                  what="dd's first reads")
            dd.send_signal(signal.SIGKILL)
            assert dd.wait(30) == -signal.SIGKILL or dd.returncode == 0
        _direct_reads(path, data, 1 * MiB, range(0, len(data), 1 * MiB))
        with open(path, "rb") as f:
            assert f.read() == data
        assert _by_workers(_replies(port)) > 0


def test_a_random_read_straight_from_the_stream_is_answered_by_its_worker_as_it_lands(emu):
    """A random 4 KiB read is read straight from the handle's stream, uncached:
    the worker that reads it writes its reply, the FUSE process none. Exact
    bytes, the object's short last page too."""
    data = payload(64 * MiB + 3, seed=36)
    emu.seed(BUCKET, "random.bin", data)
    context, port = _mount(emu)
    with context as mount:
        path = mount.path / "random.bin"
        rng = random.Random(5)
        offsets = [rng.randrange(0, len(data) // (4 * KiB)) * 4 * KiB for _ in range(63)] + [64 * MiB]
        _direct_reads(path, data, 4 * KiB, offsets[:1])  # the handle's first read may start readahead
        # Each reader has its bytes before the FUSE process hears that the worker answered.
        first = until(lambda: _answered(_replies(port)) == 1 and _replies(port), 30, "the first read's reply counted")
        _direct_reads(path, data, 4 * KiB, offsets[1:])
        after = until(lambda: _answered(_replies(port)) == 64 and _replies(port), 30, "every reply counted")
        by_worker = after.get("landed", 0) - first.get("landed", 0)
        assert by_worker >= 48, (first, after)


def test_the_first_read_of_a_file_is_answered_by_the_worker_as_its_block_lands(emu):
    """The first READ of a cold file waits for the one block it is in: the
    worker that reads the block answers it with its part as the block lands."""
    data = payload(16 * MiB, seed=37)
    emu.seed(BUCKET, "first.bin", data)
    context, port = _mount(emu, "--page-store-buffer", "0")  # the READs come to the mount
    with context as mount:
        with open(mount.path / "first.bin", "rb") as f:
            f.seek(4096)
            assert f.read(64 * KiB) == data[4096:4096 + 64 * KiB]
            # The reader has its bytes before the FUSE process hears that the
            # worker answered (kept open: a release would cancel the READ's fetch).
            until(lambda: _replies(port).get("landed", 0) >= 1, 30, "the worker's reply counted")
        with open(mount.path / "first.bin", "rb") as f:
            assert f.read() == data
