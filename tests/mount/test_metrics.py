"""Prometheus metrics, scraped from a real mount while it reads, writes, is
redirected and meets errors; and the sans-I/O operation statistics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rapidmount.emulator import Emulator
from rapidmount.fuse.stats import OperationStats
from tests.mountutil import HangGuard, rapidmount_command, require_fuse, unmount

BUCKET = "metrics-bucket"
BIG = os.urandom(5 * 1024 * 1024 + 123)
SMALL = os.urandom(300_000)

guard = HangGuard(120)
hang_guard = guard.autouse_fixture()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_with_reads_writes_redirects_and_errors():
    port = free_port()
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        emu.seed(BUCKET, "big.bin", BIG)
        emu.seed(BUCKET, "small.bin", SMALL)
        with guard.mount(emu, BUCKET, "--prometheus-port", str(port)) as m:
            before = scrape(port)
            # --cache-size less the transfer buffer (a quarter by default)
            assert value(before, "rapidmount_page_cache_budget_bytes") == 192 * 1024 * 1024

            emu.add_fault("broken-read:after=3000000,object=big.bin")
            with open(m.path / "big.bin", "rb") as f:
                assert f.read() == BIG
                during = scrape(port)
            assert value(during, "rapidmount_streams_open", direction="read") >= 1

            emu.add_fault("redirect-read:object=small.bin")
            assert (m.path / "small.bin").read_bytes() == SMALL

            emu.add_fault("redirect-write:object=new.txt")
            with open(m.path / "new.txt", "wb") as f:
                f.write(b"y" * 1_000_000)
            emu.add_fault("broken-write:after=300000,object=other.txt")
            with open(m.path / "other.txt", "wb") as f:
                f.write(b"z" * 1_000_000)

            emu.add_fault("unavailable:method=GetObject,count=2")
            assert not (m.path / "no-such-file").exists()  # retried past UNAVAILABLE

            after = scrape(port)

        assert emu.read_object(BUCKET, "new.txt") == b"y" * 1_000_000
        assert emu.read_object(BUCKET, "other.txt") == b"z" * 1_000_000

    def moved(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("rapidmount_fuse_operations_total", op="read") > 0
    assert moved("rapidmount_fuse_operations_total", op="write") > 0
    assert moved("rapidmount_fuse_operations_total", op="lookup") > 0
    assert moved("rapidmount_fuse_operation_seconds_count", op="read") == \
        moved("rapidmount_fuse_operations_total", op="read")
    assert moved("rapidmount_fuse_operation_seconds_sum", op="read") > 0
    assert value(after, "rapidmount_fuse_operation_seconds_bucket", op="read", le="+Inf") == \
        value(after, "rapidmount_fuse_operations_total", op="read")
    # What the FUSE process answered, and what the workers stored into the kernel's page cache ahead of it.
    assert moved("rapidmount_read_bytes_total") + moved("rapidmount_kernel_page_store_bytes_total", outcome="stored") \
        >= len(BIG) + len(SMALL)
    assert moved("rapidmount_kernel_page_stores_total", outcome="failed") == 0
    assert moved("rapidmount_written_bytes_total") == 2_000_000
    assert moved("rapidmount_writers_flushed_total") >= 1
    assert moved("rapidmount_page_cache_misses_total") > 0
    assert moved("rapidmount_page_cache_hits_total") > 0
    assert value(after, "rapidmount_page_cache_bytes") > 0
    assert moved("rapidmount_metadata_cache_misses_total") > 0
    assert moved("rapidmount_streams_opened_total", direction="read") >= 2
    assert moved("rapidmount_streams_redirected_total", direction="read") >= 1
    assert moved("rapidmount_streams_reconnected_total", direction="read") >= 1
    assert moved("rapidmount_streams_opened_total", direction="write") >= 2
    assert moved("rapidmount_streams_redirected_total", direction="write") >= 1
    assert moved("rapidmount_streams_reconnected_total", direction="write") >= 1
    assert moved("rapidmount_grpc_errors_total", method="GetObject", code="UNAVAILABLE") == 2
    assert moved("rapidmount_grpc_errors_total", method="BidiReadObject", code="ABORTED") >= 1
    assert value(after, "process_resident_memory_bytes") > 0


def test_metrics_endpoint_stops_at_unmount(tmp_path):
    require_fuse()
    port = free_port()
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        with guard.mount(emu, BUCKET, "--prometheus-port", str(port)) as m:
            assert "rapidmount_fuse_operations_total" in str(scrape(port))
            m.process.terminate()
            assert m.process.wait(timeout=30) == 0
        with pytest.raises(OSError):
            scrape(port)


def test_port_in_use_is_one_line_and_exit_3(tmp_path):
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with Emulator(buckets={BUCKET: "zonal"}) as emu, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            result = subprocess.run(
                rapidmount_command("--foreground", "--anonymous", "--endpoint", emu.endpoint,
                                   "--log-file", str(tmp_path / "log"), "--prometheus-port", str(port),
                                   BUCKET, str(mnt)),
                capture_output=True, text=True, timeout=60)
        finally:
            unmount(str(mnt))
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot serve metrics on 127.0.0.1:{port}" in lines[0], result.stderr
    assert not os.path.ismount(mnt)
    assert f"cannot serve metrics on 127.0.0.1:{port}" in (tmp_path / "log").read_text()


def test_operation_stats_histogram_is_cumulative():
    stats = OperationStats(buckets=(0.001, 0.01))
    stats.record("read", 500_000, failed=False)  # 0.5 ms
    stats.record("read", 1_000_000, failed=False)  # exactly 1 ms: in the le=0.001 bucket
    stats.record("read", 5_000_000, failed=True)
    stats.record("read", 3_000_000_000, failed=False)
    count, errors, seconds, buckets = stats.snapshot()["read"]
    assert (count, errors) == (4, 1)
    assert seconds == pytest.approx(3.0065)
    assert buckets == [("0.001", 2), ("0.01", 3), ("+Inf", 4)]


def test_prometheus_flags_reject_bad_values(tmp_path):
    for flag, bad, fragment in (("--prometheus-port", "70000", "port out of range"),
                                ("--prometheus-port", "http", "not a port number"),
                                ("--prometheus-address", "localhost:9", "not an IP address")):
        result = subprocess.run([sys.executable, "-m", "rapidmount.daemon.cli", flag, bad, "bucket-name",
                                 str(tmp_path)], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and fragment in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_counters_and_error_subjects():
    import threading

    import grpc

    from rapidmount.shared import wire
    from rapidmount.storage.counters import RpcErrorCounts, StreamEvents
    from rapidmount.workers.client.storage import _subject_of

    events = StreamEvents()
    events.on_read("open")
    events.on_read("redirect")
    events.on_write("reconnect")
    assert (events.read["open"], events.read["redirect"], events.write["reconnect"], events.write["open"]) == \
        (1, 1, 1, 0)

    errors = RpcErrorCounts()
    threads = [threading.Thread(target=lambda: [errors.add("GetObject", grpc.StatusCode.UNAVAILABLE)
                                                for _ in range(1000)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors.add("ListObjects", grpc.StatusCode.NOT_FOUND)
    assert errors.snapshot() == {("GetObject", "UNAVAILABLE"): 4000, ("ListObjects", "NOT_FOUND"): 1}

    storage, control = wire.storage, wire.control
    assert _subject_of(storage.GetObjectRequest(bucket="b", object="a/b.txt")) == "a/b.txt"
    assert _subject_of(storage.MoveObjectRequest(source_object="x", destination_object="y")) == "x"
    assert _subject_of(storage.UpdateObjectRequest(object=storage.Object(name="m.txt"))) == "m.txt"
    assert _subject_of(storage.ListObjectsRequest(parent="p", prefix="dir/")) == "dir/"
    assert _subject_of(control.CreateFolderRequest(parent="p", folder_id="f/")) == "f/"
    assert _subject_of(control.DeleteFolderRequest(name="projects/_/buckets/b/folders/d/")) == "d/"
    assert _subject_of(control.GetStorageLayoutRequest(name="projects/_/buckets/b/storageLayout")) is None
