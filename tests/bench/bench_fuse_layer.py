"""Before/after benchmark of the FUSE layer: the mount served through pyfuse3/libfuse
(``before``: the tree at ``--before-tree``, commit 6c181a8) against the mount that
speaks the kernel protocol itself (``after``: this tree), with Google's official
client (``official``) as the yardstick, in one run against one emulator process
(in memory, latency 0).

- B1: ``dd if=MOUNT/obj of=/dev/null bs=1M`` of one ``--size-mib`` object (written
  by the official client, finalized) through a fresh mount, page cache dropped
  first, against one official process reading it whole with one MRD; MB/s and
  CPU-s per GiB of the FUSE process, of its worker processes, of the official process.
- W1: ``dd if=LOCAL of=MOUNT/new bs=1M conv=fsync`` of ``--write-mib`` into a fresh
  mount against one official appendable-writer process; MB/s and CPU-s per GiB.
  Each side's objects are deleted after it.
- S1: ``--files`` files of ``--size-kib`` in one directory, read by one thread in
  name order, each opened by its path (no listing first), read with one
  ``read()`` and closed. Cold: on a fresh mount; warm: the same pass again on
  that mount. The same two passes on a copy of the files on local disk (/tmp,
  page cache dropped before its cold pass) are the reference. Files/s, µs per
  file, CPU µs per file of the FUSE process and of its workers, and FUSE
  requests per file (``rapidmount_fuse_operations_total`` from
  ``--prometheus-port``, scraped before and after each pass).

Each round runs every side once, one fresh mount per side, in an order that
rotates between rounds. Tables give the median and (min-max) of the rounds,
the ratio to the official client (S1: to local disk) and, for ``after``, to
``before``. Each side's first mount prints its daemon's "mounted" line (which
code it runs); a side that fails is reported and left out of later rounds.

    git worktree add /tmp/rapidmount-before 6c181a8
    sudo .venv/bin/python tests/bench/bench_fuse_layer.py [--only B1,W1,S1] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench import bench_dataplane, bench_mount_write  # noqa: E402
from tests.bench.bench_dataplane import CpuSnapshot, cpu_delta, official_read, ratio, settle, spread  # noqa: E402
from tests.bench.bench_mount_write import delete_objects, official_write  # noqa: E402
from tests.bench.common import (  # noqa: E402
    GiB, MiB, drop_caches, emulator_process, free_port, median, mount_process, official_client, print_table,
    save_results)

READ_BUCKET = bench_dataplane.BUCKET  # B1 and S1: the bucket bench_dataplane's official reader reads
WRITE_BUCKET = bench_mount_write.BUCKET  # W1: the bucket bench_mount_write's official writer writes
B1_OBJECT = "fuse-layer/b1.bin"
S1_DIR = "s1"
PIECE = 16 * MiB


# -- seeding with the official client ----------------------------------------------------------

async def _seed(endpoint: str, sources: dict[str, pathlib.Path], concurrency: int = 16) -> None:
    """Write each local file as an object of READ_BUCKET with the official appendable writer, finalized."""
    from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter

    client = official_client(endpoint)
    pending = iter(sources.items())

    async def writer() -> None:
        for name, path in pending:
            object_writer = AsyncAppendableObjectWriter(client, READ_BUCKET, name)
            await object_writer.open()
            with open(path, "rb") as source:  # noqa: ASYNC230 - seeding, not timed
                while piece := source.read(PIECE):
                    await object_writer.append(piece)
            await object_writer.close(finalize_on_close=True)

    await asyncio.gather(*(writer() for _ in range(concurrency)))


def random_file(path: pathlib.Path, size: int) -> pathlib.Path:
    with open(path, "wb") as file:
        for start in range(0, size, PIECE):
            file.write(os.urandom(min(PIECE, size - start)))
    return path


def warm(path: pathlib.Path) -> None:
    """Read a local file through, so dd and the official writer both find it in the page cache."""
    with open(path, "rb") as file:
        while file.read(PIECE):
            pass


# -- measuring -------------------------------------------------------------------------------------

def timed(mount, command: list[str], size: int) -> dict:
    """Run ``command`` to its end: MB/s, CPU-s per GiB of the FUSE process and of its workers."""
    pid = mount.process.pid
    before = CpuSnapshot.take(pid)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=1800)
    elapsed = time.perf_counter() - started
    cpu = cpu_delta(before, CpuSnapshot.take(pid))
    return {"mb_s": size / elapsed / 1e6, "elapsed_s": elapsed, "fuse_cpu_s_per_gib": cpu["fuse_cpu_s"] / (size / GiB),
            "workers_cpu_s_per_gib": cpu["workers_cpu_s"] / (size / GiB)}


def fuse_operations(port: int | None) -> dict[str, float] | None:
    """``rapidmount_fuse_operations_total`` by op, or None without metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    return {sample.labels["op"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "rapidmount_fuse_operations_total"}


# -- S1: small files, one thread ---------------------------------------------------------------

def read_pass(directory: pathlib.Path, names: list[str], size: int, mount=None, port: int | None = None) -> dict:
    """Open, read (one ``read()``) and close each file in order: files/s, µs per file and, through a
    mount, CPU µs per file of the FUSE process and its workers and FUSE requests per file by op."""
    ops_before = fuse_operations(port)
    cpu_before = CpuSnapshot.take(mount.process.pid) if mount else None
    started = time.perf_counter()
    for name in names:
        fd = os.open(directory / name, os.O_RDONLY)
        try:
            if len(os.read(fd, size)) != size:
                raise RuntimeError(f"short read of {directory / name}")
        finally:
            os.close(fd)
    elapsed = time.perf_counter() - started
    result = {"files_s": len(names) / elapsed, "us_per_file": elapsed / len(names) * 1e6}
    if mount:
        cpu = cpu_delta(cpu_before, CpuSnapshot.take(mount.process.pid))
        result.update(fuse_cpu_us_per_file=cpu["fuse_cpu_s"] / len(names) * 1e6,
                      workers_cpu_us_per_file=cpu["workers_cpu_s"] / len(names) * 1e6)
    ops_after = fuse_operations(port)
    if ops_before is not None and ops_after is not None:
        result["requests_per_file"] = {op: (count - ops_before.get(op, 0)) / len(names)
                                       for op, count in sorted(ops_after.items()) if count > ops_before.get(op, 0)}
    return result


# -- the rounds --------------------------------------------------------------------------------

def run_rounds(workload: str, sides: dict, rounds: int, results: dict, errors: dict, summary) -> None:
    """Each round, every side once, the order rotating; a side that fails is reported and dropped."""
    names = list(sides)
    runs = results.setdefault(workload, {side: [] for side in names})
    for round_ in range(rounds):
        for side in names[round_ % len(names):] + names[:round_ % len(names)]:
            if (workload, side) in errors:
                continue
            try:
                runs[side].append(sides[side](f"{round_}"))
            except (RuntimeError, OSError, subprocess.SubprocessError) as err:
                text = getattr(err, "stderr", None) or str(err)
                errors[(workload, side)] = text if isinstance(text, str) else text.decode(errors="replace")
                print(f"{workload} {side}: FAILED: {errors[(workload, side)][-3000:]}", flush=True)
        print(f"round {round_ + 1} {workload}: " + ", ".join(f"{side} {summary(runs[side][-1])}"
                                                          for side in names if len(runs[side]) > round_), flush=True)


def throughput_table(title: str, runs: dict) -> None:
    """side, MB/s, ratio to official and to before, CPU-s per GiB by process."""
    mb_s = {side: [run["mb_s"] for run in side_runs] for side, side_runs in runs.items()}
    rows = []
    for side, side_runs in runs.items():
        official = side == "official"
        rows.append([side, spread(mb_s[side]), ratio(mb_s[side], mb_s.get("official", [])),
                     ratio(mb_s[side], mb_s.get("before", [])) if side == "after" else "-",
                     "-" if official else spread([run["fuse_cpu_s_per_gib"] for run in side_runs], 2),
                     "-" if official else spread([run["workers_cpu_s_per_gib"] for run in side_runs], 2),
                     spread([run["official_cpu_s_per_gib"] for run in side_runs], 2) if official else "-"])
    print_table(title, ["side", "MB/s", "/official", "/before", "CPU-s/GiB FUSE process", "CPU-s/GiB workers",
                        "CPU-s/GiB official process"], rows)


def s1_tables(title: str, runs: dict) -> None:
    for phase in ("cold", "warm"):
        local = [run[phase]["files_s"] for run in runs.get("local", [])]
        before = [run[phase]["files_s"] for run in runs.get("before", [])]
        rows = []
        for side, side_runs in runs.items():
            passes = [run[phase] for run in side_runs]
            files_s = [p["files_s"] for p in passes]
            requests = [sum(p["requests_per_file"].values()) for p in passes if "requests_per_file" in p]
            rows.append([side, spread(files_s), spread([p["us_per_file"] for p in passes], 1), ratio(files_s, local),
                         ratio(files_s, before) if side == "after" else "-",
                         spread([p["fuse_cpu_us_per_file"] for p in passes if "fuse_cpu_us_per_file" in p], 1),
                         spread([p["workers_cpu_us_per_file"] for p in passes if "workers_cpu_us_per_file" in p], 1),
                         spread(requests, 2)])
        print_table(f"{title}, {phase}", ["side", "files/s", "µs/file", "/local", "/before", "FUSE CPU µs/file",
                                          "workers CPU µs/file", "FUSE requests/file"], rows)
    rows = [[side, phase, ", ".join(f"{op} {median([run[phase]['requests_per_file'].get(op, 0) for run in side_runs]):.2f}"
                                    for op in sorted({op for run in side_runs
                                                      for op in run[phase].get("requests_per_file", {})}))]
            for side, side_runs in runs.items() if side != "local" for phase in ("cold", "warm")]
    print_table(f"{title}: FUSE requests per file by op (median of the rounds)", ["side", "pass", "requests"], rows)


# -- the workloads' sides: each a function of the round (a tag) to its result ------------------

class Sides:
    """What every side needs: the emulator, the trees to mount, the extra mount flags."""

    def __init__(self, endpoint: str, trees: dict[str, str | None], extra: list[str]) -> None:
        self.endpoint, self.trees, self.extra = endpoint, trees, extra
        self.mounted: dict[str, str] = {}  # side -> its daemon's "mounted" log line

    @contextlib.contextmanager
    def mount(self, side: str, bucket: str, port: int | None = None):
        """A fresh, idle mount of the side's tree."""
        flags = [*self.extra, *(["--prometheus-port", str(port)] if port else [])]
        with mount_process(self.endpoint, bucket, *flags, tree=self.trees[side]) as mount:
            if side not in self.mounted:
                log = (mount.path.parent / "daemon.log").read_text(errors="replace")
                self.mounted[side] = next((line[line.index("mounted gs://"):] for line in log.splitlines()
                                           if "mounted gs://" in line), "?")
                print(f"{side}: {self.mounted[side]}", flush=True)
            settle(mount.process.pid)
            yield mount

    def b1(self, size: int) -> dict:
        def official(_tag: str) -> dict:
            run = official_read(self.endpoint, [B1_OBJECT], [])  # drops the page cache first
            return {"mb_s": run["mb_s"], "official_cpu_s_per_gib": run["client_cpu_s_per_gib"]}

        def mounted(side: str):
            def read(_tag: str) -> dict:
                with self.mount(side, READ_BUCKET) as mount:
                    drop_caches()
                    return timed(mount, ["dd", f"if={mount.path / B1_OBJECT}", "of=/dev/null", "bs=1M"], size)
            return read

        return {"official": official, **{side: mounted(side) for side in self.trees}}

    def w1(self, source: pathlib.Path) -> dict:
        size = source.stat().st_size

        def official(tag: str) -> dict:
            warm(source)
            try:
                run = official_write(self.endpoint, [str(source)], f"w1-{tag}")
            finally:
                delete_quietly(self.endpoint, f"official-w1-{tag}-0")
            return {"mb_s": run["mb_s"], "official_cpu_s_per_gib": run["cpu_s_per_gib"]}

        def mounted(side: str):
            def write(tag: str) -> dict:
                name = f"{side}-w1-{tag}"
                warm(source)
                try:
                    with self.mount(side, WRITE_BUCKET) as mount:
                        return timed(mount, ["dd", f"if={source}", f"of={mount.path / name}", "bs=1M", "conv=fsync"],
                                     size)
                finally:
                    delete_quietly(self.endpoint, name)
            return write

        return {"official": official, **{side: mounted(side) for side in self.trees}}

    def s1(self, local: pathlib.Path, names: list[str], size: int) -> dict:
        def on_disk(_tag: str) -> dict:
            drop_caches()
            return {phase: read_pass(local, names, size) for phase in ("cold", "warm")}

        def mounted(side: str):
            def read(_tag: str) -> dict:
                port = free_port()
                with self.mount(side, READ_BUCKET, port) as mount:
                    return {phase: read_pass(mount.path / S1_DIR, names, size, mount, port)
                            for phase in ("cold", "warm")}
            return read

        return {"local": on_disk, **{side: mounted(side) for side in self.trees}}


def delete_quietly(endpoint: str, name: str) -> None:
    """Delete a W1 object; one a failed side never wrote is not there."""
    from google.api_core.exceptions import NotFound

    with contextlib.suppress(NotFound):
        delete_objects(endpoint, [name])


# -- main --------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="rounds (default 3; --quick: 1)")
    parser.add_argument("--size-mib", type=int, help="B1 object, MiB (default 512; --quick: 64)")
    parser.add_argument("--write-mib", type=int, help="W1 file, MiB (default 1024; --quick: 128)")
    parser.add_argument("--files", type=int, help="S1 files (default 2000; --quick: 200)")
    parser.add_argument("--size-kib", type=int, default=64, help="each S1 file, KiB (default 64)")
    parser.add_argument("--only", default="B1,W1,S1", help="workloads to run, e.g. B1,S1")
    parser.add_argument("--before-tree", default="/tmp/rapidmount-before",
                        help="source tree of the before side (git worktree add /tmp/rapidmount-before 6c181a8)")
    parser.add_argument("--mount-args", default="", help="extra rapidmount flags, for both mounts")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (a smoke run)")
    args = parser.parse_args()
    for name, full, quick in (("rounds", 3, 1), ("size_mib", 512, 64), ("write_mib", 1024, 128),
                              ("files", 2000, 200)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.only = [item.strip().upper() for item in args.only.split(",") if item.strip()]
    if set(args.only) - {"B1", "W1", "S1"}:
        parser.error(f"--only: unknown workloads {sorted(set(args.only) - {'B1', 'W1', 'S1'})}")
    return args


def main() -> int:
    args = parse_args()
    trees: dict[str, str | None] = {"after": None}
    if (pathlib.Path(args.before_tree) / "rapidmount" / "cli.py").exists():
        trees = {"before": args.before_tree, **trees}
    else:
        print(f"note: no before tree at {args.before_tree} (git worktree add {args.before_tree} 6c181a8): "
              "the before side is skipped")
    size, file_size = args.size_mib * MiB, args.size_kib * 1024
    results: dict = {"args": vars(args), "trees": trees}
    errors: dict = {}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-fuse-") as scratch_dir, \
            emulator_process("--bucket", f"{READ_BUCKET}:zonal", "--bucket", f"{WRITE_BUCKET}:zonal") as (endpoint, _):
        scratch = pathlib.Path(scratch_dir)
        sides = Sides(endpoint, trees, args.mount_args.split())
        local = scratch / S1_DIR
        local.mkdir()
        names = [f"file-{index:06d}" for index in range(args.files)] if "S1" in args.only else []
        sources = {f"{S1_DIR}/{name}": random_file(local / name, file_size) for name in names}
        if "B1" in args.only:
            sources[B1_OBJECT] = random_file(scratch / "b1.bin", size)
        print(f"seeding {len(sources)} objects with the official client ...", flush=True)
        asyncio.run(_seed(endpoint, sources))
        (scratch / "b1.bin").unlink(missing_ok=True)
        for workload in args.only:
            if workload == "B1":
                run_rounds("B1", sides.b1(size), args.rounds, results, errors, lambda run: f"{run['mb_s']:.0f} MB/s")
            elif workload == "W1":
                source = random_file(scratch / "w1.bin", args.write_mib * MiB)
                run_rounds("W1", sides.w1(source), args.rounds, results, errors,
                           lambda run: f"{run['mb_s']:.0f} MB/s")
                source.unlink()
            else:
                run_rounds("S1", sides.s1(local, names, file_size), args.rounds, results, errors,
                           lambda run: f"cold {run['cold']['files_s']:.0f}, warm {run['warm']['files_s']:.0f} files/s")
        results["mounted"] = sides.mounted

    rounds = f"median (min-max) of {args.rounds} round{'s' if args.rounds > 1 else ''}"
    if "B1" in results:
        throughput_table(f"B1: dd bs=1M of one {args.size_mib} MiB object vs one official MRD, {rounds}",
                         results["B1"])
    if "W1" in results:
        throughput_table(f"W1: dd bs=1M conv=fsync of {args.write_mib} MiB vs the official appendable writer, "
                         f"{rounds}", results["W1"])
    if "S1" in results:
        s1_tables(f"S1: {args.files} files of {args.size_kib} KiB, one thread, open/read/close by path, {rounds}",
                  results["S1"])
    for (workload, side), text in errors.items():
        print(f"\n{workload} {side} FAILED:\n{text[-3000:]}")
    results["errors"] = {f"{workload} {side}": text for (workload, side), text in errors.items()}
    print(f"\nraw results: {save_results('fuse-layer', results)}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
