"""Benchmark B3: one large object with the emulator capped per stream.

The emulator runs with ``--stream-bandwidth`` (100 MB/s by default), which
models the service's per-stream ceiling at this machine's scale: one stream
moves at most the cap, N streams up to N times it. Same emulator process,
same object, one run; each round (fresh mount, page cache dropped):

- Google's official client: one ``AsyncMultiRangeDownloader`` reading the
  whole object (one stream; this version has no multi-stream downloader);
- the same client with N downloaders opened by hand, each reading one
  N-th of the object at once (what a user of that client could do);
- ``dd bs=1M`` through the mount with ``--read-streams 1``;
- ``dd bs=1M`` through the mount with ``--read-streams N`` (the default).

The order of the official client and the mount alternates by round. It
prints MB/s medians with their range, each mount's ratio to the
single-stream official client, and the daemon's CPU seconds per GiB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (  # noqa: E402
    MiB, Sink, drop_caches, emulator_process, median, mount_process, official_client, print_table, save_results,
    timed_dd_read)

BUCKET = "bench-bucket"
BIG = "streams/big.bin"


def seed(data_dir: str, size: int) -> None:
    from rapidmount.emulator import Emulator

    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        emulator.seed(BUCKET, BIG, os.urandom(size))


async def official_read(endpoint: str, size: int, downloaders: int) -> float:
    """MB/s of the official client reading the whole object with ``downloaders`` MRDs at once."""
    from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

    client = official_client(endpoint)
    started = time.perf_counter()
    first = await AsyncMultiRangeDownloader.create_mrd(client, BUCKET, BIG)
    mrds = [first] + list(await asyncio.gather(*(
        AsyncMultiRangeDownloader.create_mrd(client, BUCKET, BIG, generation=first.generation,
                                             read_handle=first.read_handle)
        for _ in range(downloaders - 1))))
    part = -(-size // downloaders)
    sinks = [Sink() for _ in mrds]
    if downloaders == 1:
        await first.download_ranges([(0, 0, sinks[0])])
    else:
        await asyncio.gather(*(mrd.download_ranges([(index * part, min(part, size - index * part), sink)])
                               for index, (mrd, sink) in enumerate(zip(mrds, sinks))))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(mrd.close() for mrd in mrds))
    assert sum(sink.count for sink in sinks) == size, [sink.count for sink in sinks]
    return size / elapsed / 1e6


def mount_read(endpoint: str, size: int, streams: int, extra: list[str]) -> tuple[float, float]:
    """(MB/s, daemon CPU-s per GiB) of one dd through a fresh mount."""
    with mount_process(endpoint, BUCKET, "--read-streams", str(streams), *extra) as mount:
        return timed_dd_read(mount, BIG, size)


def _spread(values: list[float], digits: int = 0) -> str:
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> int:
    from rapidmount.daemon.config import FLAG_BY_DEST

    default_streams = FLAG_BY_DEST["read_streams"].default
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-bandwidth", default="100000000",
                        help="emulator cap per read stream, bytes per second, or off (default: 100 MB/s)")
    parser.add_argument("--streams", type=int, default=default_streams,
                        help=f"--read-streams of the multi-stream mount (default: the flag's default, "
                             f"{default_streams})")
    parser.add_argument("--mount-args", default="", help="extra rapidmount flags")
    args = parser.parse_args()
    size = args.size_mib * MiB
    extra = args.mount_args.split()
    multi = f"mount --read-streams {args.streams}"
    series: dict[str, list[float]] = {"official 1 MRD": [], f"official {args.streams} MRDs": [],
                                      "mount --read-streams 1": [], multi: []}
    cpu: dict[str, list[float]] = {"mount --read-streams 1": [], multi: []}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-data-") as data_dir:
        seed(data_dir, size)
        with emulator_process("--stream-bandwidth", args.stream_bandwidth, data_dir=data_dir) as (endpoint, _):
            for round_ in range(args.rounds):
                def official() -> None:
                    for count in (1, args.streams):
                        drop_caches()
                        series[f"official {count} MRD{'s' if count > 1 else ''}"].append(
                            asyncio.run(official_read(endpoint, size, count)))

                def mount() -> None:
                    for streams, name in ((1, "mount --read-streams 1"), (args.streams, multi)):
                        mbps, cpu_per_gib = mount_read(endpoint, size, streams, extra)
                        series[name].append(mbps)
                        cpu[name].append(cpu_per_gib)

                for step in ((official, mount) if round_ % 2 == 0 else (mount, official)):
                    step()
                print(f"round {round_ + 1}: " + ", ".join(f"{name} {values[-1]:.0f} MB/s"
                                                          for name, values in series.items()), flush=True)
    baseline = median(series["official 1 MRD"])
    results = {"size_mib": args.size_mib, "rounds": args.rounds, "stream_bandwidth": args.stream_bandwidth,
               "streams": args.streams, "mb_s": series, "daemon_cpu_s_per_gib": cpu,
               "ratio_to_official_1_mrd": {name: median(values) / baseline for name, values in series.items()}}
    rows = []
    for name, values in series.items():
        rows.append([name, _spread(values), f"{median(values) / baseline:.2f}",
                     _spread(cpu[name], 2) if name in cpu else ""])
    cap = "uncapped" if args.stream_bandwidth == "off" else f"capped at {float(args.stream_bandwidth) / 1e6:g} MB/s"
    print_table(f"B3: one {args.size_mib} MiB object, emulator {cap} per stream "
                f"(median (min-max) of {args.rounds} rounds)",
                ["reader", "MB/s", "vs official 1 MRD", "daemon CPU-s per GiB"], rows)
    print(f"\nraw results: {save_results('streams', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
