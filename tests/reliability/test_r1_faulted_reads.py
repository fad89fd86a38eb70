"""R1: reads under a fault schedule return exact bytes and no error.

Every read stream breaks after 8 MiB, 1% of calls fail UNAVAILABLE, 1% of
chunks carry a wrong CRC32C, and every stream that opens without the routing token is redirected.
The object is read sequentially through the mount, with several streams
per file (the default) on two workers; the bytes must be exact and the
application must see no error. Short: 256 MiB; soak: 10 GiB
(``RAPIDMOUNT_R1_MIB``).
"""

from __future__ import annotations

import hashlib
import time

from rapidmount.emulator import Emulator
from tests.mountutil import mounted, payload
from tests.reliability.conftest import size

MiB = 1 << 20
BUCKET = "r1-bucket"
PART = 64 * MiB  # the object is this many reproducible parts


def test_r1_reads_under_a_fault_schedule_are_exact(report):
    total = size(256, 10240, env="RAPIDMOUNT_R1_MIB") * MiB
    parts = max(1, total // PART)
    with Emulator(buckets={BUCKET: "zonal"}, seed=1) as emu:
        expected = hashlib.sha256()
        # The emulator keeps objects in memory: a large object is many parts.
        names = []
        for index in range(parts):
            data = payload(min(PART, total), 500 + index)
            expected_part = hashlib.sha256(data).hexdigest()
            name = f"part-{index:04d}.bin"
            emu.seed(BUCKET, name, data)
            names.append((name, expected_part, len(data)))
            expected.update(data)
        for spec in ("broken-read:after=8388608,count=inf", "unavailable:rate=0.01,count=inf,method=BidiReadObject",
                     "corrupt-read:rate=0.01,count=inf", "redirect-read:token=r1-route,count=inf"):
            emu.add_fault(spec)
        wrong = errors = read = 0
        started = time.monotonic()
        with mounted(emu.endpoint, BUCKET, "--workers", "2", "--retry-deadline", "60") as m:
            for name, digest, length in names:
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
        elapsed = time.monotonic() - started
        streams = emu.rpc_counts.get("BidiReadObject", 0)
    report("R1", f"read {read / MiB:.0f} MiB of {total / MiB:.0f} under the fault schedule in {elapsed:.0f}s: "
                 f"{wrong} objects with wrong bytes, {errors} errors seen by the application "
                 f"({streams} read streams opened for {read / (8 * MiB):.0f} x 8 MiB)")
    assert wrong == 0 and errors == 0 and read == total
