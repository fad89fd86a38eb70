"""R11: data-plane workers killed (SIGKILL) again and again, or hung
(SIGSTOP), while six threads create new files, write 64 KiB, fsync, close,
read them back and unlink them, and two threads append with fsync.

Goal: not one operation fails and every byte is exact. A worker's death is
the daemon's business: a create, a delete, a takeover or a read whose
worker died is made again on another worker, and a change the bucket had
already made is recognised as done (see docs/reliability.md). Short: 8 s of
kills every 1.2 s; soak: 30 s (``RAPIDMOUNT_R11_SECONDS``).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time

from rapidmount.emulator import Emulator
from tests.mount.test_metrics import free_port, scrape, value
from tests.mountutil import HangGuard, errno_name, write_all
from tests.polling import until
from tests.reliability.conftest import size

KiB = 1 << 10
MiB = 1 << 20
BUCKET = "r11-bucket"
CREATORS, APPENDERS = 6, 2
KILL_EVERY = 1.2

_GUARD = HangGuard(240)
_hang_guard = _GUARD.autouse_fixture()


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops = 0
        self.failed: list[str] = []
        self.wrong: list[str] = []

    def done(self) -> None:
        with self.lock:
            self.ops += 1

    def fail(self, what: str, err: OSError) -> None:
        with self.lock:
            self.failed.append(f"{what}: {errno_name(err.errno)}")


def _create_cycle(directory, index: int, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(index)
    for n in range(10**9):
        if stop.is_set():
            return
        path = directory / f"c{index}-{n}"
        data = rng.randbytes(64 * KiB)
        step = "create"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            tally.done()
            try:
                step = "write"
                write_all(fd, data)
                step = "fsync"
                os.fsync(fd)
                tally.done()
            finally:
                step = "close"
                os.close(fd)
                tally.done()
            step = "read back"
            if path.read_bytes() != data:
                tally.wrong.append(str(path.name))
            tally.done()
            step = "unlink"
            os.unlink(path)
            tally.done()
        except OSError as err:
            tally.fail(f"{step} {path.name}", err)


def _append_cycle(path, seed: int, stop: threading.Event, tally: Tally, written: bytearray) -> None:
    rng = random.Random(seed)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as err:
        tally.fail(f"open {path.name}", err)
        return
    try:
        while not stop.is_set():
            piece = rng.randbytes(rng.randrange(4 * KiB, 64 * KiB))
            write_all(fd, piece)
            written += piece
            os.fsync(fd)
            tally.done()
    except OSError as err:
        tally.fail(f"append {path.name}", err)
    finally:
        try:
            os.close(fd)
        except OSError as err:
            tally.fail(f"close {path.name}", err)


def _read_cycle(path, expected: str, stop: threading.Event, tally: Tally) -> None:
    """Read a large file again and again, its pages dropped each time, so
    every pass comes from the workers (over several streams)."""
    while not stop.is_set():
        try:
            digest = hashlib.sha256()
            with open(path, "rb", buffering=0) as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                while chunk := f.read(MiB):
                    digest.update(chunk)
            if digest.hexdigest() != expected:
                tally.wrong.append(path.name)
            tally.done()
        except OSError as err:
            tally.fail(f"read {path.name}", err)


def _workload(m, emu, hurt, seconds: float, reading: tuple | None = None) -> tuple[Tally, int, int]:
    """Run the workload for ``seconds`` while ``hurt(m, rng)`` strikes every
    KILL_EVERY seconds; (tally, strikes, wrong bytes of the appended objects).
    ``reading``: (path, sha256) of a large file a seventh thread reads again and again."""
    directory = m.path / "work"
    directory.mkdir()
    stop, tally = threading.Event(), Tally()
    appended = [bytearray() for _ in range(APPENDERS)]
    threads = [threading.Thread(target=_create_cycle, args=(directory, i, stop, tally)) for i in range(CREATORS)]
    threads += [threading.Thread(target=_append_cycle, args=(directory / f"log{i}", 100 + i, stop, tally,
                                                             appended[i])) for i in range(APPENDERS)]
    if reading is not None:
        threads.append(threading.Thread(target=_read_cycle, args=(*reading, stop, tally)))
    for thread in threads:
        thread.start()
    rng = random.Random(11)
    strikes = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(KILL_EVERY)
            strikes += hurt(m, rng)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    wrong = sum(emu.read_object(BUCKET, f"work/log{i}") != bytes(appended[i]) for i in range(APPENDERS))
    return tally, strikes, wrong


def _kill_one(m, rng: random.Random) -> int:
    pids = m.worker_pids()
    if not pids:
        return 0
    try:
        os.kill(rng.choice(pids), signal.SIGKILL)
    except ProcessLookupError:
        return 0
    return 1


def test_r11_workers_killed_again_and_again_cost_no_operation(report):
    seconds = size(8, 30, env="RAPIDMOUNT_R11_SECONDS")
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        with _GUARD.mount(emu, BUCKET, "--workers", "2") as m:
            tally, kills, wrong = _workload(m, emu, _kill_one, seconds)
    report("R11", f"workers killed every {KILL_EVERY}s for {seconds}s: {kills} kills, {tally.ops} operations, "
                  f"{len(tally.failed)} failed, {len(tally.wrong)} files read back wrong, "
                  f"{wrong} appended objects not exact")
    assert kills >= seconds // KILL_EVERY - 1
    assert not tally.failed and not tally.wrong and not wrong, tally.failed[:10]


def test_r11_a_hung_worker_is_replaced_and_costs_no_operation(report):
    stopped: list[int] = []

    def stop_one(m, rng: random.Random) -> int:
        if stopped:
            return 0
        # Only a worker that answers calls is watched by the heartbeat: wait
        # for both (on a loaded machine the second may still be starting).
        until(lambda: len(m.worker_pids()) == 2 and all(f"data-plane worker {index} started" in m.log()
                                                             for index in (0, 1)), what="2 workers serving")
        stopped.append(rng.choice(m.worker_pids()))
        os.kill(stopped[0], signal.SIGSTOP)
        return 1

    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        # A 2 s stall timeout: the hang is noticed within a few seconds.
        with _GUARD.mount(emu, BUCKET, "--workers", "2", "--stall-timeout", "2") as m:
            try:
                tally, _, wrong = _workload(m, emu, stop_one, 10)
                replaced = stopped[0] not in m.worker_pids()
            finally:
                if stopped:
                    try:
                        os.kill(stopped[0], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    report("R11", f"a worker hung (SIGSTOP) for the rest of 10s: replaced {replaced}, {tally.ops} operations, "
                  f"{len(tally.failed)} failed, {len(tally.wrong)} read back wrong, {wrong} appended objects not exact")
    assert replaced, "the hung worker is still one of the mount's"
    assert not tally.failed and not tally.wrong and not wrong, tally.failed[:10]


def test_r11_workers_past_a_low_memory_limit_are_drained_at_no_cost(report):
    """--worker-memory-limit set so low that workers pass it again and again:
    each is drained (no new work; its streams move at their next call) and
    stopped once it serves nothing, while a replacement takes its slot."""
    seconds = size(10, 60, env="RAPIDMOUNT_R11_SECONDS")
    data = random.Random(7).randbytes(128 * MiB)
    expected = hashlib.sha256(data).hexdigest()
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        emu.seed(BUCKET, "big.bin", data)
        del data
        port = free_port()
        with _GUARD.mount(emu, BUCKET, "--workers", "2", "--read-streams", "4", "--cache-size", "32M",
                          "--worker-memory-limit", "32M", "--prometheus-port", str(port)) as m:
            tally, _, wrong = _workload(m, emu, lambda m, rng: 0, seconds, (m.path / "big.bin", expected))
            log = m.log()
            counted = value(scrape(port), "rapidmount_workers_replaced_total")
    replaced = log.count("past --worker-memory-limit")
    drained = log.count("drained; stopping it")
    report("R11", f"--worker-memory-limit 32M for {seconds}s: {replaced} workers replaced, {drained} drained, "
                  f"{tally.ops} operations, {len(tally.failed)} failed, {len(tally.wrong)} read back wrong, "
                  f"{wrong} appended objects not exact")
    assert replaced >= 2 and drained >= 1, "the check's premise: workers passed the limit"
    assert counted >= drained, "rapidmount_workers_replaced_total counts every replacement"
    assert "exited with SIGKILL" not in log
    assert not tally.failed and not tally.wrong and not wrong, tally.failed[:10]
