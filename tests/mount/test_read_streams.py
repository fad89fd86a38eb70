"""Several read streams per open file (--read-streams), through a real mount,
against the emulator with a per-stream bandwidth cap."""

from __future__ import annotations

import os
import subprocess

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import mounted, payload

MiB = 1 << 20
BUCKET = "streams-bucket"
SIZE = 64 * MiB
CAP = 50_000_000  # bytes per second per stream


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}, stream_bandwidth=CAP) as emulator:
        emulator.seed(BUCKET, "big.bin", payload(SIZE, 7))
        emulator.seed(BUCKET, "small.bin", payload(MiB, 8))
        yield emulator


def _dd(path) -> bytes:
    done = subprocess.run(["dd", f"if={path}", "bs=1M"], check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL)
    return done.stdout


def _bidi_reads(emu: Emulator) -> int:
    return emu.rpc_counts.get("BidiReadObject", 0)


def test_dd_of_a_large_file_uses_several_streams_with_exact_bytes(emu):
    with mounted(emu.endpoint, BUCKET, "--read-streams", "4") as m:
        before = _bidi_reads(emu)
        assert _dd(m.path / "big.bin") == payload(SIZE, 7)
        opened = _bidi_reads(emu) - before
        print(f"streams opened for one dd: {opened}")
        assert 2 <= opened <= 4, f"{opened} streams for one dd with --read-streams 4"
        # A small file, fetched whole at open, stays on one stream.
        before = _bidi_reads(emu)
        with open(m.path / "small.bin", "rb") as f:
            assert f.read() == payload(MiB, 8)
        assert _bidi_reads(emu) - before == 1


def test_read_streams_one_keeps_one_stream_per_file(emu):
    with mounted(emu.endpoint, BUCKET, "--read-streams", "1") as m:
        before = _bidi_reads(emu)
        with open(m.path / "big.bin", "rb") as f:
            assert f.read() == payload(SIZE, 7)
        assert _bidi_reads(emu) - before == 1
        fd = os.open(m.path / "big.bin", os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 10 * MiB) == payload(SIZE, 7)[10 * MiB:10 * MiB + 4096]
        finally:
            os.close(fd)
