"""The mount's own FUSE request loop, on real mounts over real gRPC.

What each test holds the mount to: every request received by the mount's
loop (its counters say so), INIT answered by it; exact bytes
for writes of every size and kind (whole 1 MiB WRITEs land in the arena,
half ones keep their region, small ones are copied), read back through the
mount and found in the bucket; the same through pyfuse3's loop with
``--pyfuse3-requests``; no byte lost when workers are killed under writes
whose bytes the kernel wrote into the arena; an unmount while a writer is
in the middle ends the daemon.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rapidmount.emulator import Emulator
from tests.mountutil import mounted, payload, unmount, write_all
from tests.polling import io_bytes, until
from tests.reliability.test_r4_many_handles import _free_port

KiB, MiB = 1 << 10, 1 << 20
BUCKET = "request-loop-bucket"


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


def _metric(port: int, name: str, label: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.labels[label]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name}


def _total(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name)


def _requests(port: int) -> dict[str, float]:
    return _metric(port, "rapidmount_fuse_requests_total", "path")


def _mount(emu: Emulator, *extra: str):
    port = _free_port()
    return mounted(emu.endpoint, BUCKET, "--prometheus-port", str(port), *extra), port


def _write_in_pieces(path, data: bytes, sizes: list[int], access: int = os.O_RDWR) -> None:
    """Each piece a write() from a page-aligned buffer, as dd writes. A
    read-write open writes through the page cache (large WRITEs then go
    through pipes); a write-only one bypasses it, and the kernel cuts each
    write() into WRITEs by the pages of the writer's buffer."""
    fd = os.open(path, access | os.O_CREAT | os.O_TRUNC, 0o644)
    buffer = mmap.mmap(-1, max(sizes))
    try:
        offset, turn = 0, 0
        while offset < len(data):
            piece = data[offset:offset + sizes[turn % len(sizes)]]
            buffer[:len(piece)] = piece
            with memoryview(buffer) as view:
                write_all(fd, view[:len(piece)])
            offset += len(piece)
            turn += 1
        os.fsync(fd)
    finally:
        os.close(fd)
        buffer.close()


@pytest.mark.parametrize("extra", [(), ("--pyfuse3-requests",), ("--page-store-buffer", "0", "--no-worker-replies")],
                         ids=["own-loop", "pyfuse3-loop", "workers-need-dev-fuse-only-for-writes"])
def test_writes_of_every_size_come_back_exact_through_the_mount_and_from_the_bucket(emu, extra):
    data = payload(24 * MiB + 4321, seed=41)
    context, port = _mount(emu, *extra)
    prefix = {(): "own-", ("--pyfuse3-requests",): "pyfuse3-"}.get(extra, "nodev-")
    with context as mount:
        cases = {
            f"{prefix}whole.bin": [MiB],  # whole WRITEs: the kernel writes them into the arena
            f"{prefix}mixed.bin": [MiB + 7, 600 * KiB, 200 * KiB, 4 * KiB, 3 * MiB, 1],  # half, copied, split, tiny
            f"{prefix}small.bin": [128 * KiB],
        }
        for name, sizes in cases.items():
            _write_in_pieces(mount.path / name, data, sizes)
        handed = _requests(port).get("write_by_worker", 0)
        for name, sizes in list(cases.items()):  # write-only: direct, so read from /dev/fuse into the arena
            cases[f"direct-{name}"] = sizes
            _write_in_pieces(mount.path / f"direct-{name}", data, sizes, os.O_WRONLY)
        direct_handed = _requests(port).get("write_by_worker", 0) - handed
        appended = f"{prefix}appended.bin"
        with open(mount.path / appended, "ab") as f:  # O_APPEND, in two opens
            f.write(data[:5 * MiB])
        with open(mount.path / appended, "ab") as f:
            f.write(data[5 * MiB:])
        for name in [*cases, appended]:
            with open(mount.path / name, "rb") as f:
                assert f.read() == data, name
            assert emu.read_object(BUCKET, name) == data, name
        requests = _requests(port)
        log = mount.log()
    if extra == ("--pyfuse3-requests",):
        assert not any(requests.values()), requests
        assert "pyfuse3 request loop" in log
    else:
        assert requests["write"] >= 4 * 24 and requests["read"] >= 1 and requests["other"] >= 10, requests
        assert "rapidmount request loop" in log and "FUSE 7." in log
        # Whole WRITEs after the first came through pipes: their worker read the bytes and answered;
        # not those of direct handles, which the kernel would copy into the pipe.
        assert requests["write_by_worker"] >= 20, requests
        assert direct_handed <= 1, (direct_handed, requests)
        # Whole WRITEs appended to a streaming file were taken at once, without a task.
        assert requests["write_at_once"] >= 20, requests


def test_direct_io_writes_and_reads_go_through_the_loop_exactly(emu):
    data = payload(8 * MiB, seed=42)
    context, port = _mount(emu)
    with context as mount:
        path = mount.path / "direct.bin"
        buffer = mmap.mmap(-1, MiB)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            for offset in range(0, len(data), MiB):
                buffer[:] = data[offset:offset + MiB]
                assert os.write(fd, buffer) == MiB
            os.fsync(fd)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            for _ in range(2):  # the second pass: every block cached, every READ answered at once
                before = _requests(port).get("read_at_once", 0)
                for offset in range(0, len(data), MiB):
                    assert os.preadv(fd, [buffer], offset) == MiB
                    assert buffer[:] == data[offset:offset + MiB], offset
        finally:
            os.close(fd)
            buffer.close()
        assert emu.read_object(BUCKET, "direct.bin") == data
        requests = _requests(port)
        assert requests["write"] >= 8 and requests["read_at_once"] - before == 8, requests


def test_requests_up_to_the_max_request_size_arrive_whole_and_exact(emu):
    """4 MiB READs and WRITEs (the kernel-wide limit raised, as root): a 4 MiB
    write() is one WRITE; a cold buffered read (stores off, so every byte
    comes as a READ) comes in READs above 1 MiB, over 2 MiB blocks, answered
    from the blocks' views; an O_DIRECT 4 MiB read is one READ. All exact."""
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("raising fs.fuse.max_pages_limit needs root")
    data = payload(16 * MiB + 12345, seed=44)
    emu.seed(BUCKET, "large-requests-seeded.bin", data)
    context, port = _mount(emu, "--max-request-size", "4M", "--kernel-read-ahead-kb", "4096",
                           "--page-store-buffer", "0")
    with context as mount:
        before = _requests(port).get("read", 0), _total(port, "rapidmount_read_bytes_total")
        with open(mount.path / "large-requests-seeded.bin", "rb") as f:
            assert f.read() == data
        reads = _requests(port)["read"] - before[0]
        read_bytes = _total(port, "rapidmount_read_bytes_total") - before[1]
        assert read_bytes >= len(data) and reads * MiB < read_bytes, (reads, read_bytes)
        path = mount.path / "large-requests.bin"
        before_writes = _requests(port).get("write", 0)
        _write_in_pieces(path, data, [4 * MiB])
        assert _requests(port)["write"] - before_writes == 5  # four of 4 MiB, then the rest
        buffer = mmap.mmap(-1, 4 * MiB)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            for offset in (0, 4 * MiB, 9 * MiB):
                before_reads = _requests(port)["read"]
                assert os.preadv(fd, [buffer], offset) == 4 * MiB
                assert buffer[:] == data[offset:offset + 4 * MiB], offset
                assert _requests(port)["read"] - before_reads == 1, offset
        finally:
            os.close(fd)
            buffer.close()
        log = mount.log()
    assert emu.read_object(BUCKET, "large-requests.bin") == data
    assert "max_write 4194304 (1024 pages)" in log  # asked for in the mount's own INIT reply


def test_forgets_reach_the_mount_through_its_own_loop(emu):
    """FORGET gets no reply, yet must reach the core, or the kernel's lookups
    are never given back."""
    context, port = _mount(emu)
    with context as mount:
        for index in range(20):
            path = mount.path / f"forget-{index}.txt"
            path.write_bytes(b"x")
            os.stat(path)
            path.unlink()  # the kernel drops the inode, and sends FORGET
        deadline = time.monotonic() + 20
        while _metric(port, "rapidmount_fuse_operations_total", "op").get("forget", 0) == 0:
            assert time.monotonic() < deadline, "no FORGET reached the mount"
            time.sleep(0.1)


@pytest.mark.parametrize("access", [os.O_WRONLY, os.O_RDWR], ids=["direct-into-the-arena", "through-pipes"])
def test_workers_killed_under_writes_the_kernel_put_in_the_arena_lose_no_byte(emu, access):
    data = payload(96 * MiB, seed=43)
    context, _ = _mount(emu, "--workers", "2")
    with context as mount:
        path = mount.path / "killed-writes.bin"
        problems: list[str] = []
        done = threading.Event()

        def writer() -> None:
            try:
                _write_in_pieces(path, data, [MiB], access)
            except OSError as err:
                problems.append(repr(err))
            finally:
                done.set()

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        killed = 0
        deadline = time.monotonic() + 120
        while not done.is_set() and killed < 4 and time.monotonic() < deadline:
            time.sleep(0.3)
            workers = mount.worker_pids()
            if len(workers) == 2:
                os.kill(workers[killed % 2], signal.SIGKILL)
                killed += 1
        thread.join(120)
        assert not thread.is_alive(), "a write hung after its worker was killed"
        assert not problems, problems
        assert killed >= 1
        with open(path, "rb") as f:
            assert f.read() == data
        assert emu.read_object(BUCKET, "killed-writes.bin") == data


def test_a_write_whose_worker_dies_holding_its_bytes_in_a_pipe_is_answered_and_loses_no_byte(emu):
    """The worker that appends the file is stopped, so a WRITE handed to it
    waits in its pipe; killed then, the mount reads the bytes itself and
    answers the WRITE, and the file comes out whole."""
    data = payload(8 * MiB, seed=44)
    context, port = _mount(emu, "--workers", "1")
    with context as mount:
        path = mount.path / "stopped-worker.bin"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)  # through the page cache: pipes
        try:
            for start in (0, MiB):  # large WRITEs: the next ones are spliced
                write_all(fd, data[start:start + MiB])
            handed = _requests(port)["write_by_worker"]
            assert handed >= 1
            (worker,) = mount.worker_pids()
            os.kill(worker, signal.SIGSTOP)
            try:
                finished = threading.Event()
                thread = threading.Thread(target=lambda: (write_all(fd, data[2 * MiB:3 * MiB]), finished.set()),
                                          daemon=True)
                thread.start()
                assert not finished.wait(1.0), "a WRITE handed to a stopped worker was answered"
            finally:
                os.kill(worker, signal.SIGKILL)
            thread.join(60)
            assert finished.is_set(), "the WRITE was not answered after its worker died"
            write_all(fd, data[3 * MiB:])
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(path, "rb") as f:
            assert f.read() == data
        assert emu.read_object(BUCKET, "stopped-worker.bin") == data
        assert _requests(port)["write_by_worker"] > handed


@pytest.mark.parametrize("how", ["sigterm", "abort"])
def test_a_stop_in_the_middle_of_a_write_ends_the_daemon(emu, how):
    context, _ = _mount(emu)
    with context as mount:
        writer = subprocess.Popen(["dd", "if=/dev/zero", f"of={mount.path / f'stopped-{how}.bin'}", "bs=1M",
                                   "count=100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            until(lambda: io_bytes(writer.pid, "wchar") >= 16 * MiB, what="16 MiB written")
            if how == "sigterm":  # the loop stops receiving
                mount.process.send_signal(signal.SIGTERM)
            else:  # the kernel ends the connection: the loop reads ENODEV
                connection = os.stat(mount.path).st_dev & 0xFFFFF
                with open(f"/sys/fs/fuse/connections/{connection}/abort", "w") as knob:
                    knob.write("1")
            mount.process.wait(timeout=60)
        finally:
            writer.kill()
            writer.wait(30)
            unmount(str(mount.path))
        log = mount.log()
        assert "Traceback" not in log and "internal error" not in log
