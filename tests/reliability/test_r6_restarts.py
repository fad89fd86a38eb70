"""R6: the emulator restarted, with ``--data-dir``, in the middle of reads and
of an append stream.

The emulator runs as a process of its own on a fixed port and is stopped
(SIGKILL, or SIGTERM) and started again on the same address, as a service
would be. Goal: the mount recovers within ``--retry-deadline`` of the
service coming back, loses nothing (reads are exact, every fsync'd byte
survives the restart, the object ends exactly as written) and the
application sees no error; an outage longer than the deadline fails the
pending read and fsync with EIO, not before the deadline, and the mount
works again once the service is back; restarts back to back, a few seconds
apart, each resume the read while the service is up. Short: 1 restart of
each kind per check, 5 back to back; soak: 20 (``RAPIDMOUNT_R6_RESTARTS``,
``RAPIDMOUNT_R6_BACK_TO_BACK``), with more data (``RAPIDMOUNT_R6_MIB``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from rapidmount.emulator import Emulator
from rapidmount.emulator.store import Store
from tests.conftest import SOAK
from tests.mountutil import HangGuard, errno_name, payload, stop_process, write_all
from tests.reliability.conftest import size

MiB = 1 << 20
BUCKET = "r6-bucket"
RESTARTS = size(1, 20, env="RAPIDMOUNT_R6_RESTARTS")  # of each kind (SIGKILL, SIGTERM), per check
DATA_MIB = size(64, 1024, env="RAPIDMOUNT_R6_MIB")
DEADLINE = 15  # --retry-deadline of the checks whose outages are shorter than it
SHORT_DEADLINE = 3  # --retry-deadline of the check whose outage is longer
SLACK = 2.5  # scheduling slack around a deadline (two shared cores)
KINDS = (signal.SIGKILL, signal.SIGTERM)
# The readers stay close behind their streams, so each restart breaks a read in flight.
SHORT_READAHEAD = ("--readahead-initial", "4MiB", "--readahead-max", "4MiB")

_GUARD = HangGuard(600 if SOAK else 150)
_hang_guard = _GUARD.autouse_fixture()


# ---------------------------------------------------------------- the service

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Service:
    """The emulator as a process on a fixed address, stopped and started again at will."""

    def __init__(self, data_dir, log_path, *flags: str) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.flags = flags
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> float:
        """Start it on the same port; the monotonic time it was listening."""
        command = [sys.executable, "-m", "rapidmount.emulator", "--port", str(self.port),
                   "--data-dir", str(self.data_dir), *self.flags]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log,
                                            stdin=subprocess.DEVNULL, text=True)
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline().strip() if ready else ""
        if not line.startswith("listening on "):
            stop_process(self.process, timeout=5)
            pytest.fail(f"the emulator did not start on {self.endpoint}: {line!r}\n"
                        f"{self.log_path.read_text(errors='replace')[-2000:]}")
        return time.monotonic()

    def stop(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"the emulator did not stop on {signal.Signals(signum).name} within 20s")

    def close(self) -> None:
        if self.process is not None:
            stop_process(self.process, timeout=10)

    def stored(self, name: str) -> bytes | None:
        """The object's bytes as the data directory keeps them (only while stopped)."""
        assert self.process is None or self.process.poll() is not None
        store = Store(self.data_dir)
        try:
            return store.read_all(BUCKET, name) if store.find_object(BUCKET, name) else None
        finally:
            store.close()


@contextlib.contextmanager
def service(tmp_path, seed: dict[str, bytes] | None = None, *flags: str):
    data_dir = tmp_path / "data"
    with Emulator(buckets={BUCKET: "zonal"}, data_dir=str(data_dir)) as seeder:
        for name, data in (seed or {}).items():
            seeder.seed(BUCKET, name, data)
    svc = Service(data_dir, tmp_path / "emulator.log", *flags)
    svc.start()
    try:
        yield svc
    finally:
        svc.close()


def _mount(svc: Service, *flags: str):
    return _GUARD.mount(svc.endpoint, BUCKET, "--workers", "2", *flags)


class Progress:
    """What a reader or writer thread has done, and when it last moved."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.moves: list[float] = []
        self.errors: list[str] = []
        self.finished = threading.Event()

    def add(self, count: int) -> None:
        with self.lock:
            self.done += count
            self.moves.append(time.monotonic())

    def first_move_after(self, moment: float, timeout: float) -> float | None:
        """Seconds from ``moment`` to the first progress after it (None: none within ``timeout``)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                later = [t for t in self.moves[-64:] if t > moment]
            if later:
                return later[0] - moment
            if self.finished.is_set():
                return None
            time.sleep(0.01)
        return None

    def wait_for(self, step: int, timeout: float) -> bool:
        """Whether the work moved ``step`` further within ``timeout``."""
        count = self.done + step
        end = time.monotonic() + timeout
        while self.done < count and not self.finished.is_set() and time.monotonic() < end:
            time.sleep(0.01)
        return self.done >= count


class EachProgress(Progress):
    """Progress of several readers: a restart waits until every reader moved on,
    and a recovery lasts until every reader still reading moved again."""

    def __init__(self, keys) -> None:
        super().__init__()
        self.each = {key: Progress() for key in keys}

    def add(self, count: int, key=None) -> None:
        super().add(count)
        self.each[key].add(count)

    def reading(self) -> list[Progress]:
        return [one for one in self.each.values() if not one.finished.is_set()]

    def first_move_after(self, moment: float, timeout: float) -> float | None:
        took = [one.first_move_after(moment, timeout) for one in self.reading()]
        took = [value for value in took if value is not None]
        return max(took) if took else None

    def wait_for(self, step: int, timeout: float) -> bool:
        share = step // len(self.each)
        return all(one.wait_for(share, timeout) or one.finished.is_set() for one in self.reading())


def _schedule(rng: random.Random) -> list[int]:
    kinds = [kind for kind in KINDS for _ in range(RESTARTS)]
    rng.shuffle(kinds)
    return kinds


def _restart_while(svc: Service, progress: Progress, rng: random.Random, step: int,
                   on_stopped=None) -> tuple[list[float], int]:
    """Restart the service ``2 * RESTARTS`` times, each once ``progress`` moved ``step``
    further; the recovery times (from the service back to the next progress) and how
    many restarts found the work already done."""
    recoveries = []
    missed = 0
    for kind in _schedule(rng):
        if not progress.wait_for(step, DEADLINE + SLACK) or progress.finished.is_set():
            missed += 1
            continue
        svc.stop(kind)
        if on_stopped is not None:
            on_stopped(kind)
        time.sleep(rng.uniform(0.1, 1.0))
        back = svc.start()
        took = progress.first_move_after(back, DEADLINE + SLACK)
        if took is None and not progress.finished.is_set():
            pytest.fail(f"no progress within {DEADLINE + SLACK}s of the service coming back "
                        f"(errors: {progress.errors})")
        if took is not None:
            recoveries.append(took)
    return recoveries, missed


def _times(recoveries: list[float]) -> str:
    if not recoveries:
        return "no recovery measured"
    ordered = sorted(recoveries)
    return (f"recovery median {ordered[(len(ordered) - 1) // 2]:.2f}s, max {ordered[-1]:.2f}s "
            f"(deadline {DEADLINE}s)")


# ---------------------------------------------------------------- reads

def _data(total: int, seed: int) -> bytes:
    """Reproducible random bytes, made 64 MiB at a time (``randbytes`` stops short of 256 MiB)."""
    part = 64 * MiB
    return b"".join(payload(min(part, total - start), seed + start // part) for start in range(0, total, part))


def _read_sequentially(path, digest: str, progress: Progress, chunk: int = MiB, flags: int = 0) -> bool:
    """Read the file to its end; whether its bytes were exact (errors go to ``progress``)."""
    got = hashlib.sha256()
    add = (lambda count: progress.add(count, path.name)) if isinstance(progress, EachProgress) else progress.add
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | flags), "rb", buffering=0) as f:
            while block := f.read(chunk):
                got.update(block)
                add(len(block))
    except OSError as err:
        progress.errors.append(f"{path.name}: {errno_name(err.errno)}")
        return False
    return got.hexdigest() == digest


def test_r6_restarts_during_a_sequential_read_lose_nothing(report, tmp_path):
    total = DATA_MIB * MiB
    data = _data(total, 600)
    digest = hashlib.sha256(data).hexdigest()
    # A capped stream keeps the read going across every restart.
    rate = max(32, DATA_MIB // (RESTARTS * 2)) * MiB // 2
    with service(tmp_path, {"big.bin": data}, "--stream-bandwidth", str(rate)) as svc:
        with _mount(svc, "--retry-deadline", str(DEADLINE), *SHORT_READAHEAD, "--read-streams", "1") as m:
            progress = Progress()
            result = {}

            def read() -> None:
                result["exact"] = _read_sequentially(m.path / "big.bin", digest, progress)
                progress.finished.set()

            reader = threading.Thread(target=read)
            reader.start()
            recoveries, missed = _restart_while(svc, progress, random.Random(6), total // (8 * RESTARTS))
            reader.join(timeout=total / rate * 2 + DEADLINE * 4)
            assert not reader.is_alive(), "the reader hung"
    wrong = int(not result.get("exact"))
    report("R6", f"sequential read of {total / MiB:.0f} MiB, {2 * RESTARTS - missed} restarts "
                 f"({RESTARTS} SIGKILL, {RESTARTS} SIGTERM planned): {wrong} objects with wrong bytes, "
                 f"{len(progress.errors)} errors seen; {_times(recoveries)}")
    assert wrong == 0 and not progress.errors and missed == 0
    assert max(recoveries) < DEADLINE


def test_r6_restarts_during_reads_of_several_handles_lose_nothing(report, tmp_path):
    files = 4
    part = (32 if SOAK else 16) * MiB
    objects = {f"part-{index}.bin": _data(part, 610 + 100 * index) for index in range(files)}
    # Every restart must find all readers reading: each reads its file again
    # and again until the restarts are over, over one stream per file (several
    # would multiply the pace), each capped at the service. O_DIRECT, and a
    # cache much smaller than the files, send every pass to the service.
    rate = 4 * MiB
    with service(tmp_path, objects, "--stream-bandwidth", str(rate)) as svc:
        with _mount(svc, "--retry-deadline", str(DEADLINE), "--read-streams", "1", *SHORT_READAHEAD,
                    "--cache-size", "32MiB") as m:
            progress = EachProgress(objects)
            restarts_over = threading.Event()
            wrong, passes = [], []

            def read(name: str) -> None:
                try:
                    while True:
                        if not _read_sequentially(m.path / name, hashlib.sha256(objects[name]).hexdigest(),
                                                  progress, 256 * 1024, os.O_DIRECT):
                            wrong.append(name)
                            return
                        passes.append(name)
                        if restarts_over.is_set():
                            return
                finally:
                    progress.each[name].finished.set()

            readers = [threading.Thread(target=read, args=(name,)) for name in objects]
            started = time.monotonic()
            for reader in readers:
                reader.start()

            def finish() -> None:
                for reader in readers:
                    reader.join(timeout=part / rate * 3 + DEADLINE * 4)
                progress.finished.set()

            watcher = threading.Thread(target=finish)
            try:
                # Small steps: a stream resumed after a restart may catch up in a burst.
                recoveries, missed = _restart_while(svc, progress, random.Random(7), files * MiB)
            finally:
                restarts_over.set()
            watcher.start()
            watcher.join(timeout=part / rate * 3 + DEADLINE * 5)
            assert not any(reader.is_alive() for reader in readers), "a reader hung"
            took = time.monotonic() - started
    report("R6", f"reads of {files} handles, {progress.done / MiB:.0f} MiB ({len(passes)} whole files), "
                 f"{2 * RESTARTS - missed} restarts: {len(wrong)} objects with wrong bytes, "
                 f"{len(progress.errors)} errors seen; {_times(recoveries)}")
    assert not wrong and not progress.errors and missed == 0
    assert max(recoveries) < DEADLINE
    # The check's premise: the passes came from the service, at its pace, not from a cache.
    assert progress.done <= files * (rate * took * 1.25 + 8 * MiB), \
        f"{progress.done / MiB:.0f} MiB read in {took:.0f}s: faster than the service serves them"


# ---------------------------------------------------------------- appends

def _pieces(seed: int):
    """The appender's pieces, each with whether an fsync follows it (the same for a given seed)."""
    rng = random.Random(seed)
    piece_max = 2 * MiB if SOAK else MiB
    while True:
        yield rng.randbytes(rng.randrange(1, piece_max)), rng.random() < 0.4


def _append(path, seed: int, stop, counts, failure) -> None:
    """In a process of its own: append pieces with O_APPEND, fsync at random points, until
    ``stop``; then fsync and close. ``counts``: pieces written, bytes written, bytes fsync'd."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for piece, sync in _pieces(seed):
            if stop.is_set():
                break
            write_all(fd, piece)
            counts[0] += 1
            counts[1] += len(piece)
            if sync:
                os.fsync(fd)
                counts[2] = counts[1]
        os.fsync(fd)
        counts[2] = counts[1]
        os.close(fd)
    except OSError as err:
        failure.value = err.errno or -1


def _where_blocked(pid: int) -> str:
    """Where a process waits: its state, kernel wait channel and stack (root
    only), so a hang in the mount (a FUSE request) tells itself from one of
    the process's own (a futex)."""
    facts = []
    for name in ("wchan", "stack"):
        try:
            with open(f"/proc/{pid}/{name}") as source:
                facts.append(f"{name}: {source.read().strip() or '-'}")
        except OSError as err:
            facts.append(f"{name}: {err.strerror}")
    return "; ".join(facts) or "alive"


def test_r6_restarts_during_appends_lose_no_fsynced_byte(report, tmp_path):
    # The appender is a process of its own: a thread of this one blocked in a write
    # to the mount would hold up the fork that starts the emulator again. It is
    # spawned, not forked: this process runs gRPC threads (the seeding emulator),
    # and a fork child can deadlock on a lock one of them held, which once failed
    # this test as "the appender hung" with the mount idle.
    import multiprocessing

    name, seed = "appended.log", 9
    context = multiprocessing.get_context("spawn")
    stop, failure = context.Event(), context.Value("i", 0)
    counts = context.Array("q", 3)
    lost = 0
    with service(tmp_path) as svc:
        with _mount(svc, "--retry-deadline", str(DEADLINE)) as m:
            progress = Progress()
            appender = context.Process(target=_append, args=(m.path / name, seed, stop, counts, failure))
            appender.start()

            def watch() -> None:
                seen = 0
                while appender.is_alive() or counts[1] > seen:
                    if counts[1] > seen:
                        progress.add(counts[1] - seen)
                        seen = counts[1]
                    time.sleep(0.005)
                if failure.value:
                    progress.errors.append(errno_name(failure.value))
                progress.finished.set()

            def check_stopped(_kind: int) -> None:
                nonlocal lost
                confirmed = counts[2]  # before the store: fsync'd bytes only ever grow
                stored = svc.stored(name) or b""
                lost += max(0, confirmed - len(stored))

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                recoveries, missed = _restart_while(svc, progress, random.Random(8), 4 * MiB, check_stopped)
            finally:
                stop.set()
                appender.join(timeout=DEADLINE * 4)
                hung = _where_blocked(appender.pid) if appender.is_alive() else ""
                if hung:
                    appender.kill()
                watcher.join(timeout=10)
            assert not hung, f"the appender hung: {hung}"
        svc.stop()
        stored = svc.stored(name) or b""
    pieces = _pieces(seed)
    written = b"".join(next(pieces)[0] for _ in range(counts[0]))
    mangled = int(stored != written)
    report("R6", f"appends with fsync, {len(written) / MiB:.0f} MiB, {2 * RESTARTS - missed} restarts: "
                 f"{lost} fsync'd bytes lost, {mangled} objects not exactly what was written, "
                 f"{len(progress.errors)} errors seen; {_times(recoveries)}")
    assert lost == 0 and mangled == 0 and not progress.errors and missed == 0
    assert max(recoveries) < DEADLINE


# ---------------------------------------------------------------- an outage past the deadline

def _timed(action) -> tuple[int | None, float, float]:
    """The errno ``action()`` failed with (None: it worked), and when it started and ended."""
    started = time.monotonic()
    try:
        action()
    except OSError as err:
        return err.errno, started, time.monotonic()
    return None, started, time.monotonic()


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: signal.Signals(kind).name)
def test_r6_an_outage_past_the_deadline_is_eio_then_the_mount_works_again(report, tmp_path, kind):
    data = payload(32 * MiB, 620)
    first, lost_piece, later = payload(MiB, 621), payload(MiB, 622), payload(MiB, 623)
    with service(tmp_path, {"big.bin": data}) as svc:
        with _mount(svc, "--retry-deadline", str(SHORT_DEADLINE)) as m:
            reader = os.open(m.path / "big.bin", os.O_RDONLY | os.O_DIRECT)
            appender = os.open(m.path / "log.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                assert os.pread(reader, MiB, 0) == data[:MiB]
                write_all(appender, first)
                os.fsync(appender)
                outage = time.monotonic()
                svc.stop(kind)
                outcomes = {}

                def read() -> None:
                    outcomes["read"] = _timed(lambda: os.pread(reader, MiB, 24 * MiB))

                def sync() -> None:
                    outcomes["fsync"] = _timed(lambda: (write_all(appender, lost_piece), os.fsync(appender)))

                threads = [threading.Thread(target=read), threading.Thread(target=sync)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(timeout=SHORT_DEADLINE * 5)
                assert not any(thread.is_alive() for thread in threads), "a call hung in the outage"
                back = svc.start()
                # After the service is back: the failed read does not stick, the failed append does.
                reread = _timed(lambda: os.pread(reader, MiB, 24 * MiB))
                recovered = reread[2] - back
                assert reread[0] is None, f"a read after the service came back: {errno_name(reread[0])}"
                assert os.pread(reader, MiB, 24 * MiB) == data[24 * MiB:25 * MiB]
            finally:
                os.close(reader)
                with contextlib.suppress(OSError):
                    os.close(appender)
            with open(m.path / "big.bin", "rb") as f:
                assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
            fd = os.open(m.path / "log.bin", os.O_WRONLY | os.O_APPEND)
            try:
                write_all(fd, later)
                os.fsync(fd)
            finally:
                os.close(fd)
            with open(m.path / "log.bin", "rb") as f:
                stored = f.read()
    name = signal.Signals(kind).name
    # A streak of failures runs from the first one: the service going away, not the call.
    figures = ", ".join(f"{what} {errno_name(code)} {ended - outage:.1f}s into the outage "
                        f"({ended - started:.1f}s after the call)"
                        for what, (code, started, ended) in outcomes.items())
    report("R6", f"outage past a {SHORT_DEADLINE}s deadline ({name}): {figures}; reads again "
                 f"{recovered:.2f}s after the service came back")
    for what, (code, started, ended) in outcomes.items():
        assert code == errno.EIO, f"{what} in the outage: expected EIO, got {errno_name(code)}"
        assert ended - outage >= SHORT_DEADLINE - 0.2, \
            f"{what} failed {ended - outage:.1f}s into the outage, with a {SHORT_DEADLINE}s deadline"
        assert ended - started <= SHORT_DEADLINE + SLACK, \
            f"{what} failed {ended - started:.1f}s after the call, with a {SHORT_DEADLINE}s deadline"
    assert recovered < 2 + SLACK, f"reads worked again only {recovered:.1f}s after the service came back"
    assert stored == first + later, "the append after the outage: the object is not what was fsync'd"


# ---------------------------------------------------------------- restarts back to back

BACK_TO_BACK = size(5, 20, env="RAPIDMOUNT_R6_BACK_TO_BACK")  # restarts in a row
BACK_TO_BACK_DEADLINE = 5  # shorter than the whole run of restarts, longer than any one outage
UP_WINDOW = 2.5  # seconds the service is up between two restarts


def test_r6_restarts_back_to_back_each_resume_the_read_within_its_window(report, tmp_path):
    """The service goes down again 2.5 s after each start, whether the mount
    moved or not: each up-window must resume the read (a stream open that
    missed it would spend the deadline across several outages and fail)."""
    total = (64 if not SOAK else 256) * MiB
    data = _data(total, 630)
    digest = hashlib.sha256(data).hexdigest()
    rate = 4 * MiB  # the read outlasts the restarts, each window has data to show
    rng = random.Random(63)
    with service(tmp_path, {"big.bin": data}, "--stream-bandwidth", str(rate)) as svc:
        with _mount(svc, "--retry-deadline", str(BACK_TO_BACK_DEADLINE), *SHORT_READAHEAD,
                    "--read-streams", "1") as m:
            progress = Progress()
            result = {}

            def read() -> None:
                result["exact"] = _read_sequentially(m.path / "big.bin", digest, progress, 256 * 1024)
                progress.finished.set()

            reader = threading.Thread(target=read)
            reader.start()
            assert progress.wait_for(MiB, DEADLINE), "the read did not start"
            restarts, resumed, outages = 0, [], []
            for kind in [KINDS[index % 2] for index in range(BACK_TO_BACK)]:
                if progress.finished.is_set():
                    break
                down = time.monotonic()
                svc.stop(kind)
                time.sleep(rng.uniform(0.2, 1.0))
                back = svc.start()
                outages.append(back - down)
                restarts += 1
                took = progress.first_move_after(back, UP_WINDOW)
                if took is not None:
                    resumed.append(took)
                time.sleep(max(0.0, back + UP_WINDOW - time.monotonic()))
            reader.join(timeout=total / rate * 2 + DEADLINE * 4)
            assert not reader.is_alive(), "the reader hung"
    wrong = int(not result.get("exact"))
    ordered = sorted(resumed) or [float("nan")]
    report("R6", f"back-to-back restarts during a read of {total / MiB:.0f} MiB: {restarts} restarts, "
                 f"{UP_WINDOW:g}s up between outages of {min(outages):.1f}-{max(outages):.1f}s; the read moved "
                 f"again in {len(resumed)} of {restarts} up-windows, median {ordered[(len(ordered) - 1) // 2]:.2f}s, "
                 f"max {ordered[-1]:.2f}s after the service came back; {wrong} objects with wrong bytes, "
                 f"{len(progress.errors)} errors seen (deadline {BACK_TO_BACK_DEADLINE}s)")
    assert wrong == 0 and not progress.errors
    assert restarts == BACK_TO_BACK, f"the read finished after {restarts} of {BACK_TO_BACK} restarts"
    assert len(resumed) == restarts, f"the read moved again in only {len(resumed)} of {restarts} up-windows"
