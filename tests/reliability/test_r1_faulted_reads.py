"""R1: reads under a fault schedule return exact bytes and no error.

Every read stream breaks after 8 MiB, 1% of stream calls fail UNAVAILABLE,
1% of chunks carry a wrong CRC32C, and every new stream is redirected once.
The emulator runs in a process of its own, as a remote service would. The
objects are read sequentially through the mount, several streams per file
(the default) on two workers; the bytes must be exact and the application
must see no error. Short: 256 MiB; soak: 10 GiB (``RAPIDMOUNT_R1_MIB``).
"""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
import sys
import time

from rapidmount.emulator import Emulator
from tests.mountutil import mounted, payload, stop_process
from tests.reliability.conftest import size

MiB = 1 << 20
BUCKET = "r1-bucket"
PART = 64 * MiB  # objects of this size, so the check's own memory stays small
FAULTS = ("broken-read:after=8388608,count=inf", "unavailable:rate=0.01,count=inf,method=BidiReadObject",
          "corrupt-read:rate=0.01,count=inf", "redirect-read:token=r1-route,count=inf")


@contextlib.contextmanager
def emulator_process(data_dir, log_path):
    command = [sys.executable, "-m", "rapidmount.emulator", "--port", "0", "--data-dir", str(data_dir),
               "--seed", "1", *(arg for spec in FAULTS for arg in ("--fault", spec))]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True)
    try:
        line = process.stdout.readline().strip()
        assert line.startswith("listening on "), f"the emulator did not start: {line} {log_path.read_text()}"
        yield line.removeprefix("listening on ")
    finally:
        stop_process(process, timeout=20)


def test_r1_reads_under_a_fault_schedule_are_exact(report, tmp_path):
    total = size(256, 10240, env="RAPIDMOUNT_R1_MIB") * MiB
    digests = {}
    with Emulator(buckets={BUCKET: "zonal"}, data_dir=str(tmp_path / "data")) as seeder:
        for index in range(max(1, total // PART)):
            data = payload(min(PART, total), 500 + index)
            name = f"part-{index:04d}.bin"
            seeder.seed(BUCKET, name, data)
            digests[name] = hashlib.sha256(data).hexdigest()
    wrong = errors = read = 0
    started = time.monotonic()
    with emulator_process(tmp_path / "data", tmp_path / "emulator.log") as endpoint:
        with mounted(endpoint, BUCKET, "--workers", "2", "--retry-deadline", "60") as m:
            for name, digest in digests.items():
                got = hashlib.sha256()
                try:
                    with open(m.path / name, "rb", buffering=0) as f:
                        while chunk := f.read(MiB):
                            got.update(chunk)
                            read += len(chunk)
                except OSError:
                    errors += 1
                    continue
                wrong += got.hexdigest() != digest
            reconnects = m.log().count("resuming in")
    elapsed = time.monotonic() - started
    report("R1", f"read {read / MiB:.0f} MiB of {total / MiB:.0f} under the fault schedule in {elapsed:.0f}s: "
                 f"{wrong} objects with wrong bytes, {errors} errors seen by the application "
                 f"({reconnects} streams broken and resumed)")
    assert wrong == 0 and errors == 0 and read == total
