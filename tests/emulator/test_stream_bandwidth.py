"""The emulator's per-stream read bandwidth cap (``--stream-bandwidth``).

Timings here are lower bounds only: this machine is noisy, so nothing
asserts that a read is fast. That the cap is per stream, that small reads
do not wait and that an uncapped emulator never enters the token bucket are
checked on the pacer's own decisions instead, with a fake clock or by
recording them.
"""

from __future__ import annotations

import asyncio
import io
import random
import re
import subprocess
import sys
import threading
import time

import pytest
from google.cloud import _storage_v2
from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter
from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

from rapidmount.emulator import Emulator, cli
from rapidmount.emulator.faults import Faults
from rapidmount.emulator.pacing import StreamPacer, burst_bytes, parse_bandwidth
from tests.conftest import ZONAL_BUCKET, make_official_client

KiB, MiB = 1 << 10, 1 << 20
CAP = 20_000_000  # bytes per second: 8 MiB takes about 0.41 s
SIZE = 8 * MiB
# One stream can send SIZE no faster than this (its burst goes out at once).
MIN_SECONDS = (SIZE - burst_bytes(CAP)) / CAP
# A stream's pacer asks for at most this much waiting in all (less when
# the stream was slowed by anything else, as the bucket refills meanwhile).
MAX_WAIT = MIN_SECONDS + 1e-3
assert MIN_SECONDS > 0.35


def _payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """Every pacer decision the emulator makes: (pacer id, bytes, delay)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.charges: list[tuple[int, int, float]] = []
        self.bucket_entries = 0
        self._lock = threading.Lock()
        charge, take = StreamPacer.charge, StreamPacer._take

        def recording_charge(pacer: StreamPacer, count: int) -> float:
            delay = charge(pacer, count)
            with self._lock:
                self.charges.append((id(pacer), count, delay))
            return delay

        def counting_take(pacer: StreamPacer, count: int, rate: float) -> float:
            with self._lock:
                self.bucket_entries += 1
            return take(pacer, count, rate)

        monkeypatch.setattr(StreamPacer, "charge", recording_charge)
        monkeypatch.setattr(StreamPacer, "_take", counting_take)

    def per_stream(self) -> dict[int, tuple[int, float]]:
        """Pacer id -> (bytes charged, seconds of waiting asked for)."""
        totals: dict[int, tuple[int, float]] = {}
        for pacer, count, delay in self.charges:
            charged, waited = totals.get(pacer, (0, 0.0))
            totals[pacer] = (charged + count, waited + delay)
        return totals


async def _timed_read(client, name: str, start: int = 0, length: int = 0) -> tuple[bytes, float]:
    """One BidiReadObject stream (an official AsyncMultiRangeDownloader);
    the seconds from asking for the range to holding all of it."""
    mrd = await AsyncMultiRangeDownloader.create_mrd(client, ZONAL_BUCKET, name)
    try:
        buffer = io.BytesIO()
        started = time.monotonic()
        await mrd.download_ranges([(start, length, buffer)])
        return buffer.getvalue(), time.monotonic() - started
    finally:
        await mrd.close()


# ---------------------------------------------------------------- the token bucket, on a fake clock

def _drain(pacer: StreamPacer, clock: FakeClock, chunks: list[int]) -> list[tuple[float, int]]:
    """Send chunks back to back, waiting as told: (send time, bytes) of each."""
    sent = []
    for count in chunks:
        clock.now += pacer.charge(count)
        sent.append((clock.now, count))
    return sent


def test_no_cap_never_enters_the_bucket():
    def no_clock() -> float:
        raise AssertionError("the uncapped path must not read the clock")

    pacer = StreamPacer(Faults(), clock=no_clock)
    assert all(pacer.charge(count) == 0.0 for count in (1, 4 * KiB, 2 * MiB, 2 * MiB))


def test_a_large_read_waits_for_its_bytes_beyond_the_burst():
    clock = FakeClock()
    pacer = StreamPacer(Faults(stream_bandwidth=CAP), clock=clock)
    sent = _drain(pacer, clock, [2 * MiB] * 4)
    assert sent[-1][0] - 100.0 == pytest.approx((SIZE - burst_bytes(CAP)) / CAP)


def test_small_reads_on_a_fresh_or_idle_stream_do_not_wait():
    for cap in (CAP, 1 * MiB, 100 * MiB):
        clock = FakeClock()
        pacer = StreamPacer(Faults(stream_bandwidth=cap), clock=clock)
        assert pacer.charge(4 * KiB) == 0.0  # not a whole chunk's time
        for _ in range(int(burst_bytes(cap) // (4 * KiB)) - 1):
            assert pacer.charge(4 * KiB) == 0.0
        assert pacer.charge(2 * MiB) > 0  # a busy stream pays
        clock.now += 10.0  # idle: the bucket is full again, and no fuller
        assert pacer.charge(4 * KiB) == 0.0
        assert pacer.charge(2 * MiB) == pytest.approx((2 * MiB + 4 * KiB - burst_bytes(cap)) / cap)


def test_any_window_carries_at_most_the_burst_plus_the_cap():
    rng = random.Random(5)
    clock = FakeClock()
    pacer = StreamPacer(Faults(stream_bandwidth=CAP), clock=clock)
    chunks = [rng.choice([4 * KiB, 100 * KiB, 2 * MiB, rng.randrange(1, 2 * MiB)]) for _ in range(300)]
    sent = []
    for count in chunks:
        if rng.random() < 0.1:
            clock.now += rng.random() * 0.3  # the client pauses
        clock.now += pacer.charge(count)
        sent.append((clock.now, count))
    # A chunk counts when its wait ends, which is when its last byte would
    # be on a link of the capped rate: from any chunk on, those that follow
    # within T seconds carry at most the burst plus T times the cap.
    for first in range(len(sent)):
        total = 0
        for when, count in sent[first + 1:]:
            total += count
            assert total <= burst_bytes(CAP) + (when - sent[first][0]) * CAP + 1e-3


def _concurrent_finish(pacers: list[StreamPacer], clock: FakeClock, chunks: int) -> list[float]:
    """Streams sending ``chunks`` 2 MiB chunks at once, each waiting as its
    pacer says: when each sends its last chunk."""
    ready = [clock.now] * len(pacers)
    left = [chunks] * len(pacers)
    while any(left):
        index = min((i for i in range(len(pacers)) if left[i]), key=lambda i: ready[i])
        clock.now = ready[index]
        ready[index] += pacers[index].charge(2 * MiB)
        left[index] -= 1
    return ready


def test_streams_do_not_share_a_bucket():
    faults = Faults(stream_bandwidth=CAP)
    clock = FakeClock()
    alone = _concurrent_finish([StreamPacer(faults, clock=clock)], clock, 4)[0] - 100.0
    assert alone == pytest.approx(MIN_SECONDS)
    clock = FakeClock()
    both = _concurrent_finish([StreamPacer(faults, clock=clock), StreamPacer(faults, clock=clock)], clock, 4)
    assert [when - 100.0 for when in both] == pytest.approx([MIN_SECONDS, MIN_SECONDS])
    # The contrast: had the two streams one bucket, they would finish twice as late.
    clock = FakeClock()
    shared = StreamPacer(faults, clock=clock)
    assert max(_concurrent_finish([shared, shared], clock, 4)) - 100.0 == pytest.approx(
        (2 * SIZE - burst_bytes(CAP)) / CAP)


def test_a_change_of_cap_applies_from_the_next_chunk():
    clock = FakeClock()
    faults = Faults(stream_bandwidth=CAP)
    pacer = StreamPacer(faults, clock=clock)
    clock.now += pacer.charge(2 * MiB)
    faults.stream_bandwidth = 2 * CAP
    assert pacer.charge(2 * MiB) == pytest.approx(2 * MiB / (2 * CAP))
    faults.stream_bandwidth = None
    assert pacer.charge(2 * MiB) == 0.0


# ---------------------------------------------------------------- settings

@pytest.mark.parametrize("text,expected", [("100MiB", 100 * MiB), ("100MB", 100 * MiB), ("100M/s", 100 * MiB),
                                           ("20000000", 20_000_000), ("1.5GiB", 1536 * MiB), ("off", None),
                                           ("OFF", None)])
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == expected
    assert cli.build_parser().parse_args(["--stream-bandwidth", text]).stream_bandwidth == expected


def test_cli_default_is_off():
    assert cli.build_parser().parse_args([]).stream_bandwidth is None


@pytest.mark.parametrize("text", ["0", "-5", "fast", "1.5", "10MiB/min", ""])
def test_cli_rejects_bad_bandwidths(text, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["--stream-bandwidth", text])
    assert exited.value.code == 2
    assert "--stream-bandwidth" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "20MiB", True])
def test_python_api_rejects_bad_bandwidths(value):
    with pytest.raises(ValueError):
        Emulator(stream_bandwidth=value)
    faults = Faults(stream_bandwidth=CAP)
    with pytest.raises(ValueError):
        faults.stream_bandwidth = value
    assert faults.stream_bandwidth == CAP


# ---------------------------------------------------------------- through Google's official client

@pytest.fixture
def capped():
    with Emulator(buckets={ZONAL_BUCKET: "zonal"}, stream_bandwidth=CAP) as emu:
        assert emu.stream_bandwidth == CAP
        yield emu


def test_one_capped_stream_takes_its_time(capped, monkeypatch):
    data = _payload(SIZE, 1)
    capped.seed(ZONAL_BUCKET, "big", data)
    recorder = Recorder(monkeypatch)

    async def scenario():
        return await _timed_read(make_official_client(capped.endpoint), "big")

    got, seconds = asyncio.run(scenario())
    assert got == data
    assert seconds >= MIN_SECONDS * 0.98, seconds  # lower bound only
    [(charged, waited)] = recorder.per_stream().values()
    assert charged == SIZE and 0 < waited <= MAX_WAIT


def test_each_of_two_streams_gets_the_whole_cap(capped, monkeypatch):
    """Two handles, two streams, read at once: each is paced by its own
    bucket (bytes and waits as for one stream alone), so together they move
    twice as many bytes as one in the same time."""
    first, second = _payload(SIZE, 2), _payload(SIZE, 3)
    capped.seed(ZONAL_BUCKET, "one", first)
    capped.seed(ZONAL_BUCKET, "two", second)
    recorder = Recorder(monkeypatch)

    async def scenario():
        client = make_official_client(capped.endpoint)
        started = time.monotonic()
        results = await asyncio.gather(_timed_read(client, "one"), _timed_read(client, "two"))
        return results, time.monotonic() - started

    ((got_first, seconds_first), (got_second, seconds_second)), together = asyncio.run(scenario())
    assert got_first == first and got_second == second
    assert seconds_first >= MIN_SECONDS * 0.98 and seconds_second >= MIN_SECONDS * 0.98
    streams = recorder.per_stream()
    assert len(streams) == 2
    for charged, waited in streams.values():
        # Each waits only for its own bytes: a cap shared by the two streams
        # would make them wait about twice this in all.
        assert charged == SIZE and 0 < waited <= MAX_WAIT
    print(f"two streams: {2 * SIZE / together / CAP:.2f}x the cap together "
          f"({seconds_first:.2f} s, {seconds_second:.2f} s, {together:.2f} s wall)")


def test_a_small_read_on_a_fresh_stream_does_not_wait(monkeypatch):
    with Emulator(buckets={ZONAL_BUCKET: "zonal"}, stream_bandwidth=64 * KiB) as emu:
        data = _payload(4 * MiB, 4)
        emu.seed(ZONAL_BUCKET, "big", data)
        recorder = Recorder(monkeypatch)

        async def scenario():
            return await _timed_read(make_official_client(emu.endpoint), "big", 3 * MiB + 5, 4 * KiB)

        got, _ = asyncio.run(scenario())
    assert got == data[3 * MiB + 5:3 * MiB + 5 + 4 * KiB]
    assert [(count, delay) for _, count, delay in recorder.charges] == [(4 * KiB, 0.0)]


def test_read_object_is_capped(capped, monkeypatch):
    data = _payload(SIZE, 5)
    capped.seed(ZONAL_BUCKET, "big", data)
    recorder = Recorder(monkeypatch)

    async def scenario():
        client = make_official_client(capped.endpoint)
        started = time.monotonic()
        stream = await client.grpc_client.read_object(request=_storage_v2.ReadObjectRequest(
            bucket=f"projects/_/buckets/{ZONAL_BUCKET}", object_="big"))
        parts = [response.checksummed_data.content async for response in stream]
        return b"".join(parts), time.monotonic() - started

    got, seconds = asyncio.run(scenario())
    assert got == data
    assert seconds >= MIN_SECONDS * 0.98, seconds
    [(charged, _)] = recorder.per_stream().values()
    assert charged == SIZE


def test_writes_are_not_capped(monkeypatch):
    data = _payload(4 * MiB + 7, 6)
    with Emulator(buckets={ZONAL_BUCKET: "zonal"}, stream_bandwidth=64 * KiB) as emu:
        recorder = Recorder(monkeypatch)

        async def scenario():
            writer = AsyncAppendableObjectWriter(make_official_client(emu.endpoint), ZONAL_BUCKET, "written")
            await writer.open()
            await writer.append(data)
            await writer.close(finalize_on_close=True)

        asyncio.run(scenario())
        assert emu.read_object(ZONAL_BUCKET, "written") == data
    assert recorder.charges == [] and recorder.bucket_entries == 0


def test_uncapped_reads_skip_the_bucket_and_the_cap_can_change_at_run_time(emulator, monkeypatch):
    data = _payload(SIZE, 7)
    emulator.seed(ZONAL_BUCKET, "big", data)
    recorder = Recorder(monkeypatch)
    assert emulator.stream_bandwidth is None  # off by default

    async def read() -> tuple[bytes, float]:
        return await _timed_read(make_official_client(emulator.endpoint), "big")

    got, _ = asyncio.run(read())
    assert got == data
    assert recorder.bucket_entries == 0 and all(delay == 0.0 for _, _, delay in recorder.charges)

    emulator.set_stream_bandwidth(CAP)
    got, seconds = asyncio.run(read())
    assert got == data and seconds >= MIN_SECONDS * 0.98, seconds
    assert recorder.bucket_entries > 0

    emulator.set_stream_bandwidth(None)
    entries = recorder.bucket_entries
    got, _ = asyncio.run(read())
    assert got == data and recorder.bucket_entries == entries


def test_cli_flag_caps_streams():
    process = subprocess.Popen([sys.executable, "-m", "rapidmount.emulator", "--bucket", ZONAL_BUCKET,
                                "--stream-bandwidth", "20MB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        line = process.stdout.readline()
        match = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
        assert match, (line, process.stderr.read() if process.poll() is not None else "")
        data = _payload(SIZE, 8)

        async def scenario():
            client = make_official_client(match.group(1))
            writer = AsyncAppendableObjectWriter(client, ZONAL_BUCKET, "big")
            await writer.open()
            await writer.append(data)
            await writer.close(finalize_on_close=True)
            return await _timed_read(client, "big")

        got, seconds = asyncio.run(scenario())
        assert got == data
        assert seconds >= (SIZE - burst_bytes(20 * MiB)) / (20 * MiB) * 0.98, seconds
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0
