"""R2: SIGKILL of the daemon, and of a data-plane worker, at random points
during appends with fsync at random points.

Goal: no byte that an fsync confirmed is lost, and the object is always a
prefix of what was written, never mangled. A worker's death must not even
be seen: the appends go on and the object ends exactly as written. Short:
3 trials of each; soak: 50 (``RAPIDMOUNT_R2_TRIALS``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from rapidmount.emulator import Emulator
from tests.mountutil import mounted
from tests.reliability.conftest import size

MiB = 1 << 20
BUCKET = "r2-bucket"


def _append_until(path, rng: random.Random, stop: threading.Event, pieces: int) -> tuple[bytes, int, str | None]:
    """Append random pieces, fsync at random points: (written, bytes confirmed by fsync, the error that ended it)."""
    written = bytearray()
    synced = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(pieces):
            if stop.is_set():
                break
            piece = rng.randbytes(rng.randrange(1, 3 * MiB))
            os.write(fd, piece)
            written += piece
            if rng.random() < 0.35:
                os.fsync(fd)
                synced = len(written)
        os.fsync(fd)
        synced = len(written)
    except OSError as err:
        return bytes(written), synced, os.strerror(err.errno)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    return bytes(written), synced, None


def test_r2_sigkill_of_the_daemon_loses_no_fsynced_byte(report):
    trials = size(3, 50, env="RAPIDMOUNT_R2_TRIALS")
    rng = random.Random(2)
    lost = mangled = 0
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        for trial in range(trials):
            name = f"daemon-{trial}.log"
            with mounted(emu.endpoint, BUCKET, "--workers", "1") as m:
                stop = threading.Event()
                killer = threading.Timer(rng.uniform(0.05, 0.6), lambda: (os.kill(m.pid, signal.SIGKILL), stop.set()))
                killer.start()
                written, synced, _ = _append_until(m.path / name, random.Random(trial), stop, 40)
                killer.join()
            try:
                stored = emu.read_object(BUCKET, name)
            except Exception:  # noqa: BLE001 - killed before the object was made
                stored = b""
            lost += max(0, synced - len(stored))
            mangled += stored != written[:len(stored)]
    report("R2", f"kill -9 of the daemon: {trials} trials, {lost} fsync'd bytes lost, {mangled} objects "
                 f"not a prefix of what was written")
    assert lost == 0 and mangled == 0


def test_r2_sigkill_of_a_worker_is_not_seen(report):
    trials = size(3, 50, env="RAPIDMOUNT_R2_TRIALS")
    rng = random.Random(3)
    lost = mangled = errors = kills = 0
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        with mounted(emu.endpoint, BUCKET, "--workers", "2") as m:
            for trial in range(trials):
                name = f"worker-{trial}.log"
                deadline = time.monotonic() + 20
                while len(m.worker_pids()) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)  # the last victim's replacement

                def kill() -> None:
                    nonlocal kills
                    pids = m.worker_pids()
                    if pids:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                        kills += 1
                killer = threading.Timer(rng.uniform(0.02, 0.5), kill)
                killer.start()
                written, synced, error = _append_until(m.path / name, random.Random(100 + trial), threading.Event(), 12)
                killer.join()
                errors += error is not None
                stored = emu.read_object(BUCKET, name)
                lost += max(0, synced - len(stored))
                mangled += stored != written
    report("R2", f"kill -9 of a worker: {trials} trials, {kills} workers killed, {errors} errors seen by the "
                 f"application, {lost} fsync'd bytes lost, {mangled} objects not exactly what was written")
    assert lost == 0 and mangled == 0 and errors == 0
