"""Benchmark: what the emulator costs, measured through Google's official client.

The emulator runs in its own process (the CLI), so client and server do not
share a GIL; its CPU is read from ``/proc/PID/task/*/schedstat`` (nanoseconds
on CPU, summed over its threads), which is steady even when other processes
compete for the 2 vCPUs. Three figures, each a median over ROUNDS with the
range, and its target:

- **emulator CPU per 1,000-object ListObjects page**: the official client's
  GAPIC ``list_objects`` walks OBJECTS objects (seeded in a ``--data-dir``
  store, as the listing and small-file benchmarks do), 1,000 per page;
- **emulator CPU per BidiReadObject open with a small read**: the official
  ``AsyncMultiRangeDownloader`` opens a stream on a 1 KiB object, reads
  1 KiB and closes, OPENS times per round, each on another object;
- **official-client sequential read**: SIZE bytes appended with
  ``AsyncAppendableObjectWriter`` to an in-memory emulator, then read back as
  one full-range download on one stream (GB/s = 1e9 bytes/s), with the
  append rate and emulator CPU per GiB read as context.

The same official-client loops also run against a *floor* server: a
grpc.aio server in its own process that answers ListObjects, GetObject and
BidiReadObject with constant, precomputed bytes and does nothing else.
Its CPU is what grpc.aio itself costs per call; the emulator's own work is
the difference (``--no-floor`` skips it).

``--profile`` then runs one more round of each phase with cProfile on the
emulator's serving thread (``RAPIDMOUNT_EMULATOR_PROFILE``, SIGUSR1/SIGUSR2)
and prints the top functions: the profile that bounds a missed target. The
profiled round is not part of the figures (cProfile slows the emulator).

    .venv/bin/python tests/bench/bench_emulator.py [--size-mib 1024] [--rounds 3] [--profile]
        [--tune-client-malloc] [--no-floor] [--skip-read]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import io
import os
import pstats
import resource
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import google_crc32c  # noqa: E402
from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter  # noqa: E402
from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader  # noqa: E402

from tests.bench.common import emulator_process, official_client, print_table, save_results  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
BUCKET = "bench-bucket"
PAGE = 1000
SMALL = 1024
_APPEND_BLOCK = 64 * MiB  # the writer copies each append into a BytesIO; keep that bounded

TARGET_PAGE_MS = 4.0
TARGET_OPEN_MS = 0.25
TARGET_READ_GBPS = 1.2


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


def cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of every thread of ``pid`` (schedstat's first field)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError):
            with open(path) as stat:
                total += int(stat.read().split()[0])
    return total


class Profiled:
    """cProfile on the emulator's serving thread for the duration of a ``with``."""

    def __init__(self, process, path: str | None) -> None:
        self._process, self._path = process, path

    def __enter__(self) -> "Profiled":
        if self._path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
            self._process.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        if self._path:
            self._process.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not os.path.exists(self._path) and time.monotonic() < deadline:
                time.sleep(0.05)

    def report(self, title: str, per: int, unit: str, top: int = 22) -> None:
        if not self._path or not os.path.exists(self._path):
            return
        out = io.StringIO()
        stats = pstats.Stats(self._path, stream=out)
        total = stats.total_tt  # type: ignore[attr-defined]
        print(f"\n## cProfile of the emulator's serving thread: {title}\n")
        print(f"{total * 1e3:.1f} ms profiled over {per} {unit} = {total / per * 1e3:.3f} ms per {unit[:-1]} "
              "(with cProfile's own overhead; the figures above are without it)\n")
        stats.sort_stats("tottime").print_stats(top)
        print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))


def seed(data_dir: str, objects: int) -> list[str]:
    from rapidmount.emulator import Emulator

    names = [f"dir{i // PAGE:03d}/obj{i % PAGE:05d}.bin" for i in range(objects)]
    payload = os.urandom(SMALL)
    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        for start in range(0, objects, 5000):
            emulator.seed_many(BUCKET, {name: payload for name in names[start:start + 5000]})
    return names


async def walk(client) -> tuple[int, int]:
    from google.cloud._storage_v2.types import storage as types

    token, count, pages = "", 0, 0
    while True:
        response = await client.grpc_client.list_objects(request=types.ListObjectsRequest(
            parent=f"projects/_/buckets/{BUCKET}", page_size=PAGE, page_token=token))
        count += len(response.objects)
        pages += 1
        token = response.next_page_token
        if not token:
            return count, pages


async def small_reads(client, names: list[str]) -> None:
    for name in names:
        downloader = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, name)
        sink = io.BytesIO()
        await downloader.download_ranges([(0, SMALL, sink)])
        await downloader.close()
        assert len(sink.getvalue()) == SMALL, (name, len(sink.getvalue()))


async def get_objects(client, names: list[str]) -> None:
    from google.cloud._storage_v2.types import storage as types

    for name in names:
        resource = await client.grpc_client.get_object(request=types.GetObjectRequest(
            bucket=f"projects/_/buckets/{BUCKET}", object=name))
        assert resource.size == SMALL


async def metadata_phase(endpoint: str, pid: int, names: list[str], rounds: int, opens: int,
                         profile: str | None, process) -> dict:
    client = official_client(endpoint)
    count, pages = await walk(client)  # warm up: channel, first pages, caches
    assert count == len(names), (count, len(names))
    await small_reads(client, names[:20])
    await get_objects(client, names[:20])
    page_ms, open_ms, get_ms = [], [], []
    for round_number in range(rounds):
        before = cpu_ns(pid)
        count, pages = await walk(client)
        page_ms.append((cpu_ns(pid) - before) / pages / 1e6)
        assert count == len(names)
        chosen = names[(round_number * opens) % len(names):][:opens]
        before = cpu_ns(pid)
        await small_reads(client, chosen)
        open_ms.append((cpu_ns(pid) - before) / len(chosen) / 1e6)
        before = cpu_ns(pid)
        await get_objects(client, chosen)
        get_ms.append((cpu_ns(pid) - before) / len(chosen) / 1e6)
    if profile:
        with Profiled(process, profile) as profiled:
            _, pages = await walk(client)
        profiled.report("ListObjects walk", pages, "pages")
        with Profiled(process, profile) as profiled:
            await small_reads(client, names[:opens])
        profiled.report("BidiReadObject open + 1 KiB read + close", opens, "opens")
        with Profiled(process, profile) as profiled:
            await get_objects(client, names[:opens])
        profiled.report("GetObject", opens, "calls")
    return {"page_ms": page_ms, "open_ms": open_ms, "get_object_ms": get_ms, "pages_per_walk": pages}


async def append_object(client, name: str, block: bytes, size: int) -> tuple[float, int]:
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


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this (client) process
    return usage.ru_utime + usage.ru_stime


async def read_object(client, name: str, size: int, expected_crc: int, client_cpu: list | None = None) -> float:
    downloader = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, name)
    sink = PreallocatedSink(size)
    cpu_before = own_cpu_s()
    started = time.perf_counter()
    await downloader.download_ranges([(0, 0, sink)])
    elapsed = time.perf_counter() - started
    if client_cpu is not None:
        client_cpu.append((own_cpu_s() - cpu_before) / (size / GiB))
    await downloader.close()
    assert sink.position == size, (sink.position, size)
    assert google_crc32c.value(bytes(sink.buffer)) == expected_crc, "downloaded bytes differ"
    return elapsed


async def read_phase(endpoint: str, pid: int, size: int, rounds: int, profile: str | None, process) -> dict:
    client = official_client(endpoint)
    block = os.urandom(min(_APPEND_BLOCK, size))
    append_s, read_s, read_cpu, client_cpu = [], [], [], []
    for round_number in range(rounds + (1 if profile else 0)):
        name = f"bench-{round_number}"
        seconds, crc = await append_object(client, name, block, size)
        if round_number == rounds:  # the profiled extra round
            with Profiled(process, profile) as profiled:
                await read_object(client, name, size, crc)
            profiled.report(f"sequential read of {size // MiB} MiB", max(1, size // MiB), "MiBs")
            break
        append_s.append(seconds)
        before = cpu_ns(pid)
        read_s.append(await read_object(client, name, size, crc, client_cpu))
        read_cpu.append((cpu_ns(pid) - before) / 1e9 / (size / GiB))
        await client.delete_object(BUCKET, name)  # keep the server's memory flat across rounds
    return {"append_s": append_s, "read_s": read_s, "read_cpu_s_per_gib": read_cpu,
            "client_cpu_s_per_gib": client_cpu}


def serve_floor(objects: int) -> None:
    """The floor server (see the module docstring); prints 'listening on HOST:PORT'."""
    import grpc

    from rapidmount.shared import wire
    from rapidmount.emulator import chunks, handles, resources
    from rapidmount.emulator.store import ObjectRecord

    S = wire.storage
    payload = os.urandom(SMALL)
    crc = google_crc32c.value(payload)
    now = time.time()

    def resource(name: str) -> bytes:
        return resources.object_bytes(ObjectRecord(BUCKET, name, 1, 1, SMALL, crc, None, True, now, now, now, "",
                                                   "RAPID", 0, {}, 1, 1))

    names = [f"dir{i // PAGE:03d}/obj{i % PAGE:05d}.bin" for i in range(objects)]
    pages = [[resource(name) for name in names[start:start + PAGE]] for start in range(0, objects, PAGE)]
    encoded_pages = [chunks.encode_list_objects(page, [], str(number + 1) if number + 1 < len(pages) else "")
                     for number, page in enumerate(pages)]
    one = resource(names[0])
    opened = chunks.encode_read_open(one, handles.read_handle(BUCKET, names[0], 1))

    async def list_objects(request, context):
        return encoded_pages[int(request.page_token or 0)]

    async def get_object(request, context):
        return one

    async def bidi_read(requests, context):
        await anext(requests)
        await context.write(opened)
        async for request in requests:
            for read_range in request.read_ranges:
                await context.write(chunks.encode_range_chunk(payload, crc, 0, read_range.read_id, True))

    def identity(data: bytes) -> bytes:
        return data

    handlers = {
        "ListObjects": grpc.unary_unary_rpc_method_handler(
            list_objects, request_deserializer=S.ListObjectsRequest.FromString, response_serializer=identity),
        "GetObject": grpc.unary_unary_rpc_method_handler(
            get_object, request_deserializer=S.GetObjectRequest.FromString, response_serializer=identity),
        "BidiReadObject": grpc.stream_stream_rpc_method_handler(
            bidi_read, request_deserializer=S.BidiReadObjectRequest.FromString, response_serializer=identity),
    }

    async def serve() -> None:
        server = grpc.aio.server(options=[*wire.GRPC_MESSAGE_OPTIONS, ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(wire.STORAGE_SERVICE, handlers)])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"listening on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


@contextlib.contextmanager
def floor_process(objects: int):
    import subprocess

    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-floor", "--objects",
                                str(objects)], stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the floor server did not start: {line!r}")
        yield line.removeprefix("listening on "), process
    finally:
        process.kill()
        process.wait()


def spread(values: list[float], fmt: str) -> tuple[str, str]:
    return format(statistics.median(values), fmt), f"{format(min(values), fmt)}-{format(max(values), fmt)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="sequential read size in MiB (default 1024)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the read phase (default 3)")
    parser.add_argument("--metadata-rounds", type=int, default=5,
                        help="rounds of the listing and stream-open phase (default 5)")
    parser.add_argument("--objects", type=int, default=10_000, help="objects listed per walk (default 10,000)")
    parser.add_argument("--opens", type=int, default=300, help="stream opens per round (default 300)")
    parser.add_argument("--profile", action="store_true",
                        help="then profile one more round of each phase and print the top functions")
    parser.add_argument("--skip-read", action="store_true", help="only the listing and stream-open phase")
    parser.add_argument("--tune-client-malloc", action="store_true",
                        help="also keep large buffers in this (client) process's heap, as the emulator does")
    parser.add_argument("--no-floor", action="store_true", help="skip the grpc.aio floor server")
    parser.add_argument("--serve-floor", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor:
        serve_floor(args.objects)
        return 0
    if args.tune_client_malloc:
        from rapidmount.shared.allocator import retain_large_buffers
        retain_large_buffers()
    size = args.size_mib * MiB
    results: dict = {"objects": args.objects, "opens": args.opens, "size_mib": args.size_mib}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-emu-") as scratch:
        profile = os.path.join(scratch, "emulator.prof") if args.profile else None
        if profile:
            os.environ["RAPIDMOUNT_EMULATOR_PROFILE"] = profile
        data_dir = os.path.join(scratch, "data")
        names = seed(data_dir, args.objects)
        with emulator_process(data_dir=data_dir) as (endpoint, process):
            results.update(asyncio.run(metadata_phase(endpoint, process.pid, names, args.metadata_rounds,
                                                      min(args.opens, len(names)), profile, process)))
        if not args.no_floor:
            with floor_process(args.objects) as (endpoint, process):
                results["floor"] = asyncio.run(metadata_phase(endpoint, process.pid, names, args.metadata_rounds,
                                                              min(args.opens, len(names)), None, process))
        if not args.skip_read:
            with emulator_process("--bucket", f"{BUCKET}:zonal") as (endpoint, process):
                results.update(asyncio.run(read_phase(endpoint, process.pid, size, args.rounds, profile,
                                                      process)))
    rows = []
    median, lo_hi = spread(results["page_ms"], ".2f")
    met = statistics.median(results["page_ms"]) <= TARGET_PAGE_MS
    rows.append(["emulator CPU per 1,000-object ListObjects page, ms", median, lo_hi,
                 f"<= {TARGET_PAGE_MS}", "met" if met else "MISSED"])
    median, lo_hi = spread(results["open_ms"], ".3f")
    met = statistics.median(results["open_ms"]) <= TARGET_OPEN_MS
    rows.append(["emulator CPU per BidiReadObject open + 1 KiB read, ms", median, lo_hi,
                 f"<= {TARGET_OPEN_MS}", "met" if met else "MISSED"])
    rows.append(["emulator CPU per GetObject, ms", *spread(results["get_object_ms"], ".3f"), "", ""])
    if "floor" in results:
        floor = results["floor"]
        rows.append(["floor (grpc.aio, constant replies): CPU per page, ms", *spread(floor["page_ms"], ".2f"),
                     "", ""])
        rows.append(["floor: CPU per stream open + 1 KiB read, ms", *spread(floor["open_ms"], ".3f"), "", ""])
        rows.append(["floor: CPU per GetObject, ms", *spread(floor["get_object_ms"], ".3f"), "", ""])
    if not args.skip_read:
        rates = [size / s / 1e9 for s in results["read_s"]]
        met = statistics.median(rates) >= TARGET_READ_GBPS
        rows.append([f"official-client sequential read, {args.size_mib} MiB, 1 stream, GB/s",
                     *spread(rates, ".2f"), f">= {TARGET_READ_GBPS}", "met" if met else "MISSED"])
        rows.append(["emulator CPU per GiB read, s", *spread(results["read_cpu_s_per_gib"], ".3f"), "", ""])
        rows.append(["official client's CPU per GiB read (all its threads), s",
                     *spread(results["client_cpu_s_per_gib"], ".3f"), "", ""])
        rows.append(["official-client append + finalize, GB/s",
                     *spread([size / s / 1e9 for s in results["append_s"]], ".2f"), "", ""])
    print_table(f"rapidmount-emulator through the official client ({os.cpu_count()} CPUs; "
                f"{args.metadata_rounds} listing/open rounds of {args.objects} objects and {args.opens} opens, "
                f"{args.rounds} read rounds, client malloc {'tuned' if args.tune_client_malloc else 'default'})", ["figure", "median", "range", "target", ""], rows)
    print(f"\nraw results: {save_results('emulator', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
