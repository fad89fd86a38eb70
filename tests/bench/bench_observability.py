"""Benchmark: what metrics and JSON logs cost the data path.

The same mount, with and without ``--prometheus-port`` (scraped every
second while it works) and ``--log-format json``; same emulator process,
same object, one run. Reports sequential MB/s, the daemon's CPU seconds per
GiB, random 4 KiB p50/p99, the cost of one ``OperationStats.record`` call
and the time of one scrape.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
import timeit
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import (  # noqa: E402
    MiB, emulator_process, free_port, median, mount_process, percentile, print_table, save_results,
    timed_dd_read)

BUCKET = "bench-bucket"
BIG = "seq/big.bin"


def seed(data_dir: str, size: int) -> None:
    from rapidmount.emulator import Emulator

    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        emulator.seed(BUCKET, BIG, os.urandom(size))


class Scraper:
    """Scrapes /metrics every second in a thread; records how long each scrape took."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.durations: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=10) as response:
                response.read()
            self.durations.append(time.perf_counter() - started)

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_config(endpoint: str, size: int, random_reads: int, observed: bool) -> dict:
    extra: list[str] = []
    port = free_port()
    if observed:
        extra = ["--prometheus-port", str(port), "--log-format", "json"]
    with mount_process(endpoint, BUCKET, *extra) as mount:
        scraper = Scraper(port) if observed else None
        if scraper:
            scraper.__enter__()
        try:
            mb_s, cpu_s_per_gib = timed_dd_read(mount, BIG, size)
            fd = os.open(mount.path / BIG, os.O_RDONLY | os.O_DIRECT)
            try:
                buffer = bytearray(4096)
                rng = random.Random(7)
                latencies = []
                for _ in range(random_reads):
                    offset = rng.randrange(0, size // 4096) * 4096
                    t0 = time.perf_counter()
                    os.preadv(fd, [buffer], offset)
                    latencies.append(time.perf_counter() - t0)
            finally:
                os.close(fd)
        finally:
            if scraper:
                scraper.__exit__(None, None, None)
    return {"mb_s": mb_s, "cpu_s_per_gib": cpu_s_per_gib,
            "p50_ms": percentile(latencies, 0.5) * 1e3, "p99_ms": percentile(latencies, 0.99) * 1e3,
            "scrape_ms": [d * 1e3 for d in scraper.durations] if scraper else []}


def record_cost_ns() -> float:
    from rapidmount.fuse.stats import OperationStats

    stats = OperationStats()
    calls = 200_000
    seconds = min(timeit.repeat(lambda: stats.record("read", 1_234_567, False), number=calls, repeat=5))
    return seconds / calls * 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--random-reads", type=int, default=1000)
    args = parser.parse_args()
    size = args.size_mib * MiB
    results: dict = {"size": size, "rounds": args.rounds, "plain": [], "observed": []}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-data-") as data_dir:
        seed(data_dir, size)
        with emulator_process(data_dir=data_dir) as (endpoint, _):
            for _ in range(args.rounds):
                # Alternate, so drift on this noisy machine hits both alike.
                results["plain"].append(run_config(endpoint, size, args.random_reads, observed=False))
                results["observed"].append(run_config(endpoint, size, args.random_reads, observed=True))
    results["record_ns"] = record_cost_ns()

    def med(config: str, key: str) -> float:
        return median([r[key] for r in results[config]])

    rows = []
    for key, label in (("mb_s", f"sequential {args.size_mib} MiB, dd bs=1M, MB/s"),
                       ("cpu_s_per_gib", "daemon CPU seconds per GiB read"),
                       ("p50_ms", "random 4 KiB O_DIRECT p50, ms"),
                       ("p99_ms", "random 4 KiB O_DIRECT p99, ms")):
        plain, observed = med("plain", key), med("observed", key)
        rows.append([label, f"{plain:.2f}", f"{observed:.2f}", f"{observed / plain:.2f}"])
    print_table(f"metrics and JSON logs, {args.rounds} rounds, medians",
                ["scenario", "plain", "metrics + json logs", "ratio"], rows)
    scrapes = [ms for r in results["observed"] for ms in r["scrape_ms"]]
    print(f"\nOperationStats.record: {results['record_ns']:.0f} ns per FUSE request")
    if scrapes:
        print(f"one scrape of /metrics: median {median(scrapes):.1f} ms, max {max(scrapes):.1f} ms "
              f"({len(scrapes)} scrapes)")
    print(f"raw results: {save_results('observability', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
