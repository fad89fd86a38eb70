"""Benchmark: the official client against rapidmount-emulator over loopback.

The emulator runs in its own process (the CLI), so client and server do not
share a GIL. Measures appending SIZE bytes with AsyncAppendableObjectWriter
(and finalizing), then reading them back as one full-range download on one
BidiReadObject stream with AsyncMultiRangeDownloader.

    .venv/bin/python tests/bench/bench_emulator.py [--size-mib 1024] [--rounds 3] [--tune-client-malloc]

On a shared 2-vCPU machine any other busy process halves the figures:
run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time

import google_crc32c
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter
from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient
from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

MiB = 1 << 20
BUCKET = "bench-bucket"
_APPEND_BLOCK = 64 * MiB  # the writer copies each append into a BytesIO; keep that bounded


class PreallocatedSink:
    """A write()-able buffer of known size, so the download pays neither for
    BytesIO growth nor for first-touch page faults (it is written once, untimed)."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(size)
        self._view = memoryview(self.buffer)
        zeros = memoryview(bytes(min(_APPEND_BLOCK, size)))
        for offset in range(0, size, len(zeros)):
            self._view[offset:offset + len(zeros)] = zeros[:size - offset]
        self.position = 0

    def write(self, data: bytes) -> int:
        end = self.position + len(data)
        self._view[self.position:end] = data
        self.position = end
        return len(data)


def start_emulator() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "rapidmount.emulator", "--bucket", f"{BUCKET}:zonal"],
        stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"emulator did not start: {line!r}")
    return process, line.removeprefix("listening on ")


async def append_object(client: AsyncGrpcClient, name: str, block: bytes, size: int) -> tuple[float, int]:
    writer = AsyncAppendableObjectWriter(client, BUCKET, name)
    await writer.open()
    crc = 0
    started = time.perf_counter()
    for offset in range(0, size, len(block)):
        piece = block[:min(len(block), size - offset)]
        await writer.append(piece)
        crc = google_crc32c.extend(crc, piece)
    resource = await writer.close(finalize_on_close=True, full_object_checksum=crc)
    elapsed = time.perf_counter() - started
    assert resource.size == size, (resource.size, size)
    return elapsed, crc


async def read_object(client: AsyncGrpcClient, name: str, size: int, expected_crc: int) -> float:
    downloader = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, name)
    sink = PreallocatedSink(size)
    started = time.perf_counter()
    await downloader.download_ranges([(0, 0, sink)])
    elapsed = time.perf_counter() - started
    await downloader.close()
    assert sink.position == size, (sink.position, size)
    assert google_crc32c.value(bytes(sink.buffer)) == expected_crc, "downloaded bytes differ"
    return elapsed


async def run(endpoint: str, size: int, rounds: int) -> dict[str, list[float]]:
    client = AsyncGrpcClient(credentials=AnonymousCredentials(),
                             client_options=ClientOptions(api_endpoint=endpoint))
    block = os.urandom(min(_APPEND_BLOCK, size))
    results: dict[str, list[float]] = {"append (AAOW, finalize)": [], "read (MRD, 1 stream)": []}
    for round_number in range(rounds):
        name = f"bench-{round_number}"
        append_s, crc = await append_object(client, name, block, size)
        results["append (AAOW, finalize)"].append(append_s)
        results["read (MRD, 1 stream)"].append(await read_object(client, name, size, crc))
        await client.delete_object(BUCKET, name)  # keep the server's memory flat across rounds
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="object size in MiB (default 1024)")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions; the table shows the median")
    parser.add_argument("--tune-client-malloc", action="store_true",
                        help="also keep large buffers in this (client) process's heap, as the emulator does")
    args = parser.parse_args()
    if args.tune_client_malloc:
        from rapidmount.allocator import retain_large_buffers
        retain_large_buffers()
    size = args.size_mib * MiB
    process, endpoint = start_emulator()
    try:
        results = asyncio.run(run(endpoint, size, args.rounds))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    print(f"rapidmount-emulator at {endpoint}, object {args.size_mib} MiB, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs, client malloc {'tuned' if args.tune_client_malloc else 'default'}")
    print(f"{'operation':<26} {'median s':>9} {'MB/s median':>12} {'MB/s min':>9} {'MB/s max':>9}")
    for operation, seconds in results.items():
        rates = [size / s / 1e6 for s in seconds]
        print(f"{operation:<26} {statistics.median(seconds):>9.2f} {statistics.median(rates):>12.0f} "
              f"{min(rates):>9.0f} {max(rates):>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
