"""Workers store read-ahead blocks straight into the kernel's page cache.

Real mounts over real gRPC. What each test holds the mount to:
exact bytes through read(), mmap and O_DIRECT; no READ for a stored range;
no hang when a store races a READ of its pages; no mix of two versions when
the object is replaced or this mount rewrites it while stores are in
flight; a right tail after appends; stores that find the inode gone, renamed
or forgotten, or their worker killed, cost nothing; a file renamed or unlinked
while open reads to its end, even over streams opened after its name was gone.
"""

from __future__ import annotations

import concurrent.futures
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

from rapidmount.daemon.serve import fuse_connection_id
from rapidmount.emulator import Emulator
from tests.mountutil import mounted, payload
from tests.polling import io_bytes, until, within
from tests.reliability.test_r4_many_handles import _free_port

MiB = 1 << 20
BUCKET = "page-store-bucket"
# 1 MiB blocks and a fixed 16 MiB window: the stored ranges are easy to name.
FLAGS = ("--cache-block-size", "1M", "--readahead-initial", "16M", "--readahead-max", "16M")
#: How late the bucket's answer to a rename comes, where a test makes it late (its modelled round trip).
LATE_ANSWER_MS = 1000


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


@pytest.fixture(autouse=True)
def _full_speed(emu):
    yield
    emu.set_stream_bandwidth(None)


class Metrics:
    def __init__(self, port: int) -> None:
        self.port = port

    def read(self) -> dict[str, float]:
        """READs answered by the FUSE process, stores by outcome, READs of
        blocks that went only to the kernel's page cache (``kernel_only_*``),
        and read streams whose open found nothing under the object's name
        (``opens_refused``: NOT_FOUND)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as response:
            text = response.read().decode()
        found = {"reads": 0.0, "opens_refused": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "rapidmount_fuse_operations_total" and sample.labels.get("op") == "read":
                    found["reads"] = sample.value
                elif sample.name == "rapidmount_kernel_page_stores_total":
                    found[sample.labels["outcome"]] = sample.value
                elif sample.name in ("rapidmount_kernel_only_reads_total", "rapidmount_kernel_only_rereads_total"):
                    found[sample.name.removeprefix("rapidmount_").removesuffix("_total")] = sample.value
                elif (sample.name == "rapidmount_grpc_errors_total" and sample.labels.get("code") == "NOT_FOUND"
                      and sample.labels.get("method") == "BidiReadObject"):
                    found["opens_refused"] = sample.value
        return found

    def wait_for(self, outcome: str, count: int, timeout: float = 30.0, also: str = "") -> dict[str, float]:
        """Until ``count`` stores had ``outcome`` (or ``also``)."""
        deadline = time.monotonic() + timeout
        while True:
            now = self.read()
            if now.get(outcome, 0) + now.get(also, 0) >= count:
                return now
            if time.monotonic() > deadline:
                raise AssertionError(f"{outcome} stores: {now} after {timeout}s, wanted {count}")
            time.sleep(0.02)


def _mount(emu: Emulator, *extra: str, metadata_ttl: str = "0"):
    port = _free_port()
    return mounted(emu.endpoint, BUCKET, "--prometheus-port", str(port), "--metadata-ttl", metadata_ttl,
                   *FLAGS, *extra), Metrics(port)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, MiB):
        chunks.append(chunk)
    return b"".join(chunks)


def test_bytes_are_exact_through_read_mmap_and_o_direct_and_stored_ranges_send_no_read(emu):
    data = payload(48 * MiB, seed=1)
    emu.seed(BUCKET, "exact.bin", data)
    context, metrics = _mount(emu)
    with context as mount:
        path = mount.path / "exact.bin"
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(fd, 64 * 1024, 0) == data[:64 * 1024]
            # The first READ issued blocks up to 17 MiB; its tripwire is the one at 9 MiB
            # (half the window before the end), whose first page is not stored.
            metrics.wait_for("stored", 12)
            before = metrics.read()["reads"]
            assert os.pread(fd, 6 * MiB, 2 * MiB) == data[2 * MiB:8 * MiB]
            assert metrics.read()["reads"] == before, "a stored range reached the FUSE process"
            assert os.pread(fd, len(data), 0) == data
        finally:
            os.close(fd)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            assert hashlib.sha256(mapped).digest() == hashlib.sha256(data).digest()
        buffered = metrics.read()
        direct = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buffer = mmap.mmap(-1, 4 * MiB)
        try:
            for offset in (0, 7 * MiB, 44 * MiB):
                count = os.preadv(direct, [buffer], offset)
                assert buffer[:count] == data[offset:offset + count] and count == 4 * MiB
        finally:
            os.close(direct)
        now = metrics.read()
        assert now["stored"] >= 30 and now.get("failed", 0) == 0
        # Without stores every MiB read through the page cache is a READ (or
        # two); with them, a few per window. O_DIRECT always reaches the FUSE process.
        assert buffered["reads"] < 48
        assert now["reads"] - buffered["reads"] >= 3
        # The mount kept no copy of the blocks at 7 and 8 MiB (stored whole;
        # their stores long made): the O_DIRECT read there read them again.
        assert now["kernel_only_rereads"] >= 2


def test_without_stores_every_read_reaches_the_fuse_process(emu):
    data = payload(24 * MiB, seed=2)
    emu.seed(BUCKET, "nostores.bin", data)
    context, metrics = _mount(emu, "--page-store-buffer", "0")
    with context as mount:
        with open(mount.path / "nostores.bin", "rb") as f:
            assert f.read() == data
        now = metrics.read()
        assert now.get("stored", 0) == 0 and now["reads"] >= 24


def test_a_reader_slower_than_the_stores_reads_a_file_past_the_cache_with_a_read_per_window(emu):
    """Blocks that went to the kernel's page cache are read there, never from
    the mount's block cache: they must not hold the cache's budget as unread
    readahead, or readahead stops once the file outgrows the cache and every
    MiB becomes a READ again."""
    data = payload(96 * MiB, seed=9)
    emu.seed(BUCKET, "slow-reader.bin", data)
    # A 24 MiB block cache (32 MiB less the 8 MiB transfer buffer): a quarter of the file.
    context, metrics = _mount(emu, "--cache-size", "32M")
    blocks = len(data) // MiB
    with context as mount:
        digest = hashlib.sha256()
        with open(mount.path / "slow-reader.bin", "rb", buffering=0) as f:
            for position in range(blocks):
                digest.update(f.read(MiB))
                # A reader slower than the bucket: the stores of the next blocks land first.
                metrics.wait_for("stored", min(blocks - 1, position + 4), timeout=15, also="raced")
            assert f.read(MiB) == b""
        assert digest.digest() == hashlib.sha256(data).digest()
        now = metrics.read()
        # About one READ per 8 MiB (the tripwires); one per MiB if readahead stalled.
        assert now["reads"] < blocks / 4, now


def test_stores_racing_reads_of_the_same_pages_neither_hang_nor_tear(emu):
    data = payload(32 * MiB, seed=3)
    emu.seed(BUCKET, "race.bin", data)
    context, metrics = _mount(emu)
    with context as mount:
        path = mount.path / "race.bin"
        problems: list[str] = []

        def reader(index: int) -> None:
            rng = random.Random(index)
            fd = os.open(path, os.O_RDONLY)
            try:
                offset = 0
                while offset < len(data):
                    size = rng.choice((4096, 65536, MiB, 3 * MiB + 17))
                    got = os.pread(fd, size, offset)
                    if got != data[offset:offset + size]:
                        problems.append(f"reader {index}: wrong bytes at {offset}")
                        return
                    offset += size
            finally:
                os.close(fd)

        for _ in range(3):  # a fresh kernel cache each round
            subprocess.run(["sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"], check=False)
            threads = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            assert not any(thread.is_alive() for thread in threads), "a reader hung"
        assert not problems, problems
        assert metrics.read()["stored"] > 0


def test_an_object_replaced_while_it_is_read_never_mixes_two_versions(emu):
    old, new = payload(32 * MiB, seed=4), payload(32 * MiB, seed=5)
    emu.seed(BUCKET, "replaced.bin", old)
    context, metrics = _mount(emu)
    with context as mount:
        path = mount.path / "replaced.bin"
        emu.set_stream_bandwidth(64 * MiB)  # stores still arriving when the object changes
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.read(fd, MiB) == old[:MiB]
            emu.seed(BUCKET, "replaced.bin", new)
            emu.set_stream_bandwidth(None)
            # The open handle keeps reading its generation, all of it.
            assert old[MiB:] == _read_all(fd)
        finally:
            os.close(fd)
        for _ in range(3):
            with open(path, "rb") as f:
                got = f.read()
            assert got == new, "a new open must read the new version whole"
        assert metrics.read()["stored"] > 0


def test_a_rewrite_by_this_mount_while_stores_are_in_flight_leaves_no_old_page(emu):
    """Drain before change: a store of the old bytes that lands after the
    rewrite began would put old bytes back over the written ones in the
    kernel's page cache. (The kernel also drops a file's pages when a
    GETATTR after a write shows a new mtime; the drain does not rely on it.)
    The test checks both: every late store is refused, and the bytes are the new ones."""
    context, metrics = _mount(emu, metadata_ttl="60")
    with context as mount:
        path = mount.path / "rewritten.bin"
        old = payload(24 * MiB, seed=60)
        emu.seed(BUCKET, "rewritten.bin", old)
        # Whether a store is still on its way when the rewrite begins depends on
        # timing: rounds go on (at most 8) until at least one was refused.
        round_ = 0
        while round_ < 3 or (not metrics.read()["stale"] and round_ < 8):
            new = payload(24 * MiB, seed=70 + round_)
            emu.set_stream_bandwidth(MiB)  # each 1 MiB block takes a second: most stores land after the write
            fd = os.open(path, os.O_RDONLY)  # a reader keeps the file open meanwhile
            try:
                assert os.pread(fd, 4096, 0) == old[:4096]  # read-ahead of 16 blocks starts
                with open(path, "w+b") as f:  # the same node, the same size, other bytes
                    f.write(new)
                    f.flush()
                    emu.set_stream_bandwidth(None)
                    # Every read-ahead block of the old bytes has arrived (16 a round).
                    metrics.wait_for("stored", 16 * (round_ + 1), also="stale")
                    assert os.pread(f.fileno(), len(new), 0) == new, f"round {round_}: old bytes in the rewritten file"
            finally:
                os.close(fd)
            old = new  # (not read back here: its blocks would be cached, and the next round race nothing)
            round_ += 1
        assert metrics.read()["stale"] >= 1, "no store was on its way in 8 rewrites: the race was never run"
        with open(path, "rb") as f:
            assert f.read() == old == emu.read_object(BUCKET, "rewritten.bin")


def test_the_tail_of_a_file_appended_to_while_it_is_read_comes_out_right(emu):
    first = payload(20 * MiB + 12345, seed=8)
    emu.seed(BUCKET, "growing.log", first, finalize=False)
    context, metrics = _mount(emu)
    other_context, _ = _mount(emu)
    with context as mount, other_context as other:
        path = mount.path / "growing.log"
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.read(fd, MiB) == first[:MiB]
            more = payload(5 * MiB + 777, seed=9)
            with open(other.path / "growing.log", "ab") as appender:
                appender.write(more)
            rest = _read_all(fd)
            assert first[MiB:] == rest[:len(first) - MiB]
        finally:
            os.close(fd)
        with open(path, "rb") as f:
            assert f.read() == first + more
        assert metrics.read()["stored"] > 0


def test_rename_and_unlink_while_stores_are_in_flight(emu):
    data = payload(24 * MiB, seed=10)
    context, metrics = _mount(emu)
    with context as mount:
        for name in ("renamed.bin", "unlinked.bin"):
            emu.seed(BUCKET, name, data)
            emu.set_stream_bandwidth(32 * MiB)
            path = mount.path / name
            fd = os.open(path, os.O_RDONLY)
            try:
                assert os.read(fd, MiB) == data[:MiB]
                if name == "renamed.bin":
                    os.rename(path, mount.path / "renamed-to.bin")
                else:
                    os.unlink(path)
                emu.set_stream_bandwidth(None)
                assert _read_all(fd) == data[MiB:]
            finally:
                os.close(fd)
        with open(mount.path / "renamed-to.bin", "rb") as f:
            assert f.read() == data
        assert not (mount.path / "unlinked.bin").exists()
        assert metrics.read().get("failed", 0) == 0


def test_rename_and_unlink_while_stores_are_in_flight_and_new_streams_find_the_old_name_gone(emu):
    """The sequence above, many times, with its race made likely. The file is
    large enough for a second stream (one opens a span, 32 MiB, further into
    the object per open stream); the first read opens one (a small first
    window); the streams stay slow, so stores stay in flight and the handle's
    reader needs another one after its object lost the name; and the bucket
    answers the rename late, so the reads go on before this mount knows the
    move is done. A stream opened then finds nothing under the old name
    (NOT_FOUND, counted per trial): the reads still get every byte, from the
    stream opened before, or from the renamed object."""
    data = payload(40 * MiB, seed=13)
    # Names are new in each trial and cached: the rename asks the bucket nothing but the move.
    context, metrics = _mount(emu, "--readahead-initial", "1M", metadata_ttl="60")
    reached = {"renamed": 0, "unlinked": 0}
    with context as mount, concurrent.futures.ThreadPoolExecutor(1) as renames:
        for trial in range(6):
            for kind in reached:
                name = f"{kind}-{trial}.bin"
                emu.seed(BUCKET, name, data)
                emu.set_stream_bandwidth(64 * MiB)
                path = mount.path / name
                before = metrics.read()["opens_refused"]
                fd = os.open(path, os.O_RDONLY)
                try:
                    assert os.read(fd, MiB) == data[:MiB]
                    renamed = None
                    if kind == "renamed":
                        emu.set_latency(LATE_ANSWER_MS)
                        renamed = renames.submit(os.rename, path, mount.path / "renamed-to.bin")
                        until(lambda: emu.object_info(BUCKET, name) is None, what="the bucket's move")
                        emu.set_latency(0)  # the move's answer, on its way, still comes late
                    else:
                        os.unlink(path)
                    assert _read_all(fd) == data[MiB:]
                    if renamed is not None:
                        renamed.result()
                finally:
                    os.close(fd)
                    emu.set_latency(0)
                    emu.set_stream_bandwidth(None)
                reached[kind] += metrics.read()["opens_refused"] > before
                assert not (mount.path / name).exists()
        with open(mount.path / "renamed-to.bin", "rb") as f:
            assert f.read() == data
        stores = metrics.read()
        assert stores.get("failed", 0) == 0 and stores["stored"] > 0
    assert all(reached.values()), f"trials in which a stream opened after the old name was gone: {reached}"


def test_a_worker_killed_while_it_stores_costs_no_read(emu):
    data = payload(64 * MiB, seed=11)
    emu.seed(BUCKET, "killed.bin", data)
    context, metrics = _mount(emu, "--workers", "2")
    with context as mount:
        for round_ in range(3):
            deadline = time.monotonic() + 60
            while len(mount.worker_pids()) < 2:  # the one killed last round is replaced
                assert time.monotonic() < deadline, "the killed worker was not replaced"
                time.sleep(0.05)
            subprocess.run(["sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"], check=False)
            fd = os.open(mount.path / "killed.bin", os.O_RDONLY)
            try:
                got = [os.read(fd, 4 * MiB)]
                os.kill(mount.worker_pids()[round_ % 2], signal.SIGKILL)
                got.append(_read_all(fd))
            finally:
                os.close(fd)
            assert b"".join(got) == data
        assert metrics.read()["stored"] > 0


def _fuse_fd_of(pid: int) -> int:
    """A copy, in this process, of the mount daemon's /dev/fuse descriptor (pidfd_getfd)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for name in os.listdir(f"/proc/{pid}/fd"):
        if os.readlink(f"/proc/{pid}/fd/{name}") == "/dev/fuse":
            pidfd = os.pidfd_open(pid)
            try:
                fd = libc.syscall(438, pidfd, int(name), 0)  # SYS_pidfd_getfd
            finally:
                os.close(pidfd)
            if fd < 0:
                pytest.fail(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
            return fd
    pytest.fail("the mount daemon holds no /dev/fuse descriptor")


def test_a_store_after_the_kernel_forgot_the_inode_is_dropped_quietly(emu):
    """The kernel answers a store to a node it no longer holds with ENOENT;
    the store thread counts it and goes on. Made from this process, with the
    mount's own descriptor and the thread the workers run."""
    from rapidmount.workers.pagestore import PageStorer
    from rapidmount.storage.counters import PageStoreCounts

    data = payload(4 * MiB, seed=12)
    emu.seed(BUCKET, "forgotten.bin", data)
    context, _ = _mount(emu)
    with context as mount:
        path = mount.path / "forgotten.bin"
        nodeid = os.stat(path).st_ino
        counts, done = PageStoreCounts(), threading.Semaphore(0)

        def report(outcome: str, size: int, seconds: float) -> None:
            counts.add(outcome, size, seconds)
            done.release()

        storer = PageStorer(16 * MiB, report)
        storer.start()
        storer.use_device(_fuse_fd_of(mount.pid))
        try:
            with open(path, "rb") as f:
                assert f.read(4096) == data[:4096]
                for _ in range(3000):  # the thread has its descriptor at once
                    if storer.ready:
                        break
                    time.sleep(0.01)
                assert storer.submit(nodeid, 0, 0, data[:MiB])
                assert done.acquire(timeout=30)
                assert counts.stores["stored"] == 1  # known to the kernel while open
            os.unlink(path)  # no name, no open file: the kernel forgets the node
            subprocess.run(["sh", "-c", "echo 2 > /proc/sys/vm/drop_caches"], check=True)
            for _ in range(100):
                if counts.stores["forgotten"]:
                    break
                assert storer.submit(nodeid, 0, MiB, data[MiB:2 * MiB])
                assert done.acquire(timeout=30)
                time.sleep(0.05)
            assert counts.stores["forgotten"] >= 1 and counts.stores["failed"] == 0, counts.stores
        finally:
            storer.close()
        emu.seed(BUCKET, "forgotten.bin", data)
        with open(path, "rb") as f:
            assert f.read() == data
        assert "Traceback" not in mount.log()


def test_a_hung_worker_whose_store_waits_on_a_read_is_replaced_and_every_read_completes(emu):
    """Workers stopped (SIGSTOP) while they store: the pool kills them, their
    calls go to new workers, and every read completes with exact bytes. A store
    blocks on pages a pending READ holds; when that READ also waits on the same
    worker (a READ across two blocks, the next one fetched there), the killed
    worker cannot exit (a thread of it is held in the kernel), so its calls are
    failed over a second after the kill, not at its exit. The window is narrow:
    this test stops the workers mid-stream, it does not force that case."""
    data = payload(96 * MiB, seed=13)
    emu.seed(BUCKET, "hung.bin", data)
    # 768 KiB blocks: the kernel's 1 MiB READs straddle two blocks; one stream, on one worker.
    context, metrics = _mount(emu, "--workers", "2", "--cache-block-size", "768K", "--read-streams", "1")
    with context as mount:
        for round_ in range(2):
            deadline = time.monotonic() + 60
            while len(mount.worker_pids()) < 2:
                assert time.monotonic() < deadline, "the stopped worker was not replaced"
                time.sleep(0.05)
            subprocess.run(["sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"], check=False)
            emu.set_stream_bandwidth(64 * MiB)  # stores and READs in flight together
            got: list[bytes] = []
            reader = threading.Thread(target=lambda: got.append(_read_all_path(mount.path / "hung.bin")))
            reader.start()
            metrics.wait_for("stored", 4 + 40 * round_)
            for pid in mount.worker_pids():
                os.kill(pid, signal.SIGSTOP)  # both hang; the pool kills them and starts others
            emu.set_stream_bandwidth(None)
            reader.join(timeout=120)
            assert not reader.is_alive(), "a read hung behind a stopped worker's store"
            assert got == [data]
        assert "Traceback" not in mount.log()


def _read_all_path(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_every_worker_knows_the_mounts_fuse_connection_to_abort_if_the_mount_dies(emu):
    """A worker whose FUSE process dies while a store sleeps on a page aborts
    the connection through fusectl (tests/unit/test_page_stores.py has the
    abort): here, that each worker, the first ones and a replacement, is told
    the number fusectl knows the mount by."""
    with mounted(emu.endpoint, BUCKET, "--workers", "2") as mount:
        device = os.stat(mount.path).st_dev
        expected = fuse_connection_id(f"{os.major(device)}:{os.minor(device)}")
        line = f"the mount's FUSE connection is {expected} (fusectl)"
        until(lambda: mount.log().count(line) == 2, what="both workers told the connection")
        os.kill(mount.worker_pids()[0], signal.SIGKILL)
        until(lambda: mount.log().count(line) == 3, what="the replacement told the connection")
        assert os.path.isdir(f"/sys/fs/fuse/connections/{expected}") or not os.path.isdir("/sys/fs/fuse/connections")


def _thread_states(pids: list[int]) -> set[str]:
    states = set()
    for pid in pids:
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    states.add(stat.read().rsplit(") ", 1)[1].split()[0])
        except OSError:
            continue
    return states


def test_a_mount_process_killed_while_a_store_waits_leaves_no_reader_hanging(emu):
    """The FUSE process stopped under a cold reader (its READs unanswered, so a
    worker's store sleeps on their pages, uninterruptibly), then SIGKILLed: the
    worker aborts the connection and the reader gets an error. Without the
    abort the worker's descriptor keeps the dead connection alive and the
    reader hangs for good. Trials until one caught a store waiting; the test
    fails if none did."""
    emu.seed(BUCKET, "orphaned.bin", os.urandom(256 * MiB))
    for trial in range(12):  # a stop may come after every store was made: again, at another point
        with mounted(emu.endpoint, BUCKET, "--workers", "1") as mount:
            workers = mount.worker_pids()
            subprocess.run(["sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"], check=False)
            reader = subprocess.Popen(["dd", f"if={mount.path / 'orphaned.bin'}", "of=/dev/null", "bs=1M"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                # Stopped at another point of the read in each trial.
                until(lambda: io_bytes(reader.pid, "rchar") >= (trial % 6 + 1) * 8 * MiB or reader.poll() is not None,
                      what="the reader's first MiBs")
                os.kill(mount.process.pid, signal.SIGSTOP)
                waiting = bool(within(lambda: "D" in _thread_states(workers), 2.0))
                os.kill(mount.process.pid, signal.SIGKILL)
                try:
                    reader.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    device = os.stat(mount.path).st_dev
                    with open(f"/sys/fs/fuse/connections/{os.minor(device)}/abort", "w") as knob:
                        knob.write("1")  # free the machine; the test has failed
                    pytest.fail(f"the reader hung after the mount's process died (a store waiting: {waiting})")
            finally:
                reader.kill()
                reader.wait(30)
            if waiting:  # the case that hung: the worker said it aborted
                until(lambda: "page-cache store waits: FUSE connection" in mount.log(), what="the abort's log line")
                break
    else:
        pytest.fail("no trial caught a worker's store waiting on the stopped process's READs")
