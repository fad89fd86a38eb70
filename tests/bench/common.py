"""Shared pieces of the benchmarks: an emulator process, a mount, the official client.

Benchmarks measure; they never assert. Each scenario runs the mount and
Google's official client on the same emulator and the same objects, in one
run, and reports their ratio, because this machine is noisy and only ratios
from one run compare.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "bench-results"
MiB = 1 << 20
GiB = 1 << 30
# What a data-plane worker process of the daemon has in its command line (and, in
# commits before the layout by process, what it had: a benchmark may run another tree).
WORKER_MARKERS = ("rapidmount.workers.main", "rapidmount.dataplane.worker")


class Sink:
    """A writable that discards, like dd's /dev/null."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, data) -> int:
        self.count += len(data)
        return len(data)



def drop_caches() -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as knob:
            knob.write("3\n")
    except OSError:
        pass  # not root: the kernel page cache stays warm; reported by the caller


@contextlib.contextmanager
def emulator_process(*args: str, data_dir: str | None = None):
    """Run ``rapidmount-emulator`` in its own process; yield its endpoint."""
    command = [sys.executable, "-m", "rapidmount.emulator", "--port", "0", *args]
    if data_dir:
        command += ["--data-dir", data_dir]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"emulator failed to start: {line} {process.stderr.read()}")
        yield line.removeprefix("listening on "), process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


class MountProcess:
    def __init__(self, path: pathlib.Path, process: subprocess.Popen) -> None:
        self.path = path
        self.process = process

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def worker_pids(self) -> list[int]:
        """The daemon's data-plane worker processes (none when it runs without workers)."""
        return worker_pids(self.process.pid)


def _proc_stat(path: str) -> tuple[str, list[str]] | None:
    """(comm, fields after the comm) of a /proc stat file; fields[0] is the state,
    fields[1] the parent pid, fields[11:15] utime, stime, cutime, cstime in ticks."""
    try:
        with open(path) as stat:
            text = stat.read()
    except OSError:
        return None
    return text[text.index("(") + 1:text.rindex(")")], text.rsplit(")", 1)[1].split()


def process_cpu(pid: int) -> tuple[float, float, float] | None:
    """(user s, sys s, reaped children's user+sys s) of a process, or None once it is gone."""
    stat = _proc_stat(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields, tick = stat[1], os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, (int(fields[13]) + int(fields[14])) / tick


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """Each live thread of a process: tid -> (name, user s, sys s)."""
    threads, tick = {}, os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return threads
    for tid in tids:
        stat = _proc_stat(f"/proc/{pid}/task/{tid}/stat")
        if stat is not None:
            threads[int(tid)] = (stat[0], int(stat[1][11]) / tick, int(stat[1][12]) / tick)
    return threads


def child_pids(pid: int) -> list[int]:
    """Direct children: /proc/PID/task/*/children where the kernel has it, else a scan of PPid."""
    children: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    try:
        for tid in tids:
            with open(f"/proc/{pid}/task/{tid}/children") as listing:
                children += [int(child) for child in listing.read().split()]
        return children
    except OSError:
        children = []  # a kernel without CONFIG_PROC_CHILDREN, or the process went away
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(f"/proc/{entry}/stat")
            if stat is not None and stat[1][1] == str(pid):
                children.append(int(entry))
    return children


def worker_pids(pid: int, markers: tuple[str, ...] = WORKER_MARKERS) -> list[int]:
    """Descendants of ``pid`` whose command line contains one of ``markers``."""
    found, pending, seen = [], child_pids(pid), {pid}
    while pending:
        child = pending.pop()
        if child in seen:
            continue
        seen.add(child)
        try:
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                command = cmdline.read()
                if any(marker.encode() in command for marker in markers):
                    found.append(child)
        except OSError:
            continue
        pending += child_pids(child)
    return sorted(found)


def process_memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes of a process; (0, 0) once it is gone. PSS splits shared pages
    (a shared-memory arena) between the processes that map them; RSS counts them in each."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    break
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return rss, pss


def _mounted(path: pathlib.Path) -> bool:
    with open("/proc/self/mountinfo") as info:
        return any(line.split()[4] == str(path) for line in info)


def _cli_module(tree: str | None) -> str:
    """The command's module in ``tree``: commits before the layout by process kept it at the top."""
    if tree and not (pathlib.Path(tree) / "rapidmount" / "daemon" / "cli.py").exists():
        return "rapidmount.cli"
    return "rapidmount.daemon.cli"


@contextlib.contextmanager
def mount_process(endpoint: str, bucket: str, *extra: str, anonymous: bool = True,
                  env: dict[str, str] | None = None, workers: int | None = None, tree: str | None = None):
    """A fresh mount; ``workers`` passes ``--workers N`` (none: the daemon's default).
    ``tree``: a source tree whose ``rapidmount`` the daemon runs (first on its PYTHONPATH; the
    daemon starts in it, since ``python -m`` puts the working directory before PYTHONPATH);
    unset, ``RAPIDMOUNT_BENCH_TREE`` names it, so that any benchmark can measure another commit."""
    tree = tree or os.environ.get("RAPIDMOUNT_BENCH_TREE") or None
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="rapidmount-bench-"))
    path = scratch / "mnt"
    path.mkdir()
    log = scratch / "daemon.log"
    command = [sys.executable, "-m", _cli_module(tree), "--foreground", *(["--anonymous"] if anonymous else []),
               "--endpoint", endpoint, "--log-file", str(log), *extra,
               *(["--workers", str(workers)] if workers is not None else []), bucket, str(path)]
    if tree:
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env, cwd=tree)
    try:
        deadline = time.monotonic() + 30
        while not (_mounted(path) and "mounted gs://" in log.read_text(errors="replace") if log.exists() else False):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mount failed: {log.read_text() if log.exists() else ''}")
            time.sleep(0.05)
        yield MountProcess(path, process)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        subprocess.run(["fusermount3", "-u", "-z", str(path)], stderr=subprocess.DEVNULL)


def released_together(commands: list[list[str]], before_go=lambda: None) -> list[dict]:
    """One process per command; once each has printed ``ready``, ``before_go()``,
    then all are released at once by a line on stdin. Returns the JSON report
    each prints when done (its timings and its own CPU)."""
    processes = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for command in commands]
    try:
        for process in processes:
            line = process.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"an official client failed to start: {line!r}")
        before_go()
        for process in processes:
            process.stdin.write("go\n")
            process.stdin.flush()
        reports = []
        for process in processes:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError("an official client died")
            reports.append(json.loads(line))
        for process in processes:
            process.wait(timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return reports


def official_client(endpoint: str):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient

    return AsyncGrpcClient(credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=endpoint))


def timed_dd_read(mount: MountProcess, name: str, size: int) -> tuple[float, float]:
    """``dd bs=1M`` of one file through ``mount``, page cache dropped first:
    (MB/s, daemon CPU seconds per GiB)."""
    drop_caches()
    cpu_before = mount.cpu_seconds()
    started = time.perf_counter()
    subprocess.run(["dd", f"if={mount.path / name}", "of=/dev/null", "bs=1M"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    return size / elapsed / 1e6, (mount.cpu_seconds() - cpu_before) / (size / GiB)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    print(f"\n## {title}\n")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")


def save_results(name: str, results: dict) -> pathlib.Path:
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    return path


def timed_preads(fd: int, offsets, size: int = 4096) -> list[float]:
    """Seconds of each ``os.pread(fd, size, offset)``, one at a time."""
    latencies = []
    for offset in offsets:
        started = time.perf_counter()
        os.pread(fd, size, offset)
        latencies.append(time.perf_counter() - started)
    return latencies
