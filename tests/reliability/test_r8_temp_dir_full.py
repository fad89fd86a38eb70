"""R8: ``--temp-dir`` full while staging.

Goal: the write() that does not fit returns ENOSPC (a short count first,
as POSIX allows, when part of one write() fitted), never EIO or a hang; the
object in the bucket keeps its generation and bytes; the daemon logs one
line, no traceback; and once space is freed the mount stages and uploads
normally again. The temp dir is a small tmpfs mounted for the test; filler
files leave a little room in it. Every way a file gets staged is tried: a
random write before and past the end, writes after ``O_TRUNC`` and
``ftruncate``, appends to a finalized object, writes on a flat bucket, the
staging copy of an object bigger than the free space (also of a file just
streamed), and several files staging at once. Short: 1 round of every case
and 6 files at once; soak: 10 rounds and 24 files (``RAPIDMOUNT_R8_ROUNDS``,
``RAPIDMOUNT_R8_FILES``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard, after_release, errno_name, errno_of
from tests.reliability.conftest import size

MiB = 1 << 20
TMPFS = 8 * MiB
ROOM = 2 * MiB  # free space the filler leaves for a case
ZONAL, FLAT = "r8-zonal", "r8-flat"
REFUSED_LINE = "No space left on device"

guard = HangGuard(240)
hang_guard = guard.autouse_fixture()


@contextlib.contextmanager
def tmpfs(nbytes: int):
    """A tmpfs of ``nbytes`` on a fresh directory, unmounted afterwards."""
    path = tempfile.mkdtemp(prefix="rapidmount-r8-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={nbytes}", "tmpfs", path],
                          capture_output=True, text=True)
    if done.returncode:
        os.rmdir(path)
        reason = f"cannot mount a tmpfs: {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


def free_bytes(path: str) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


@contextlib.contextmanager
def filled(path: str, room: int):
    """Fill ``path`` but for ``room`` bytes while the block runs."""
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, max(1, free_bytes(path) - room))
    finally:
        os.close(fd)
    try:
        yield
    finally:
        os.unlink(filler)


# ---------------------------------------------------------------- the cases

@dataclass
class Case:
    """One way of staging: ``ops`` run on a descriptor opened with ``flags``.

    ``before`` runs (and is fsync'd) before the dir fills. ``sticky``: the
    refusal comes after the staged copy changed, so fsync and close return
    ENOSPC too and nothing is uploaded; otherwise the copy itself did not
    fit, nothing changed, and fsync and close succeed with nothing to do.
    """

    name: str
    bucket: str
    seed: bytes | None
    flags: int
    ops: list[tuple]
    sticky: bool = True
    finalized: bool = True
    before: list[tuple] = field(default_factory=list)


def apply(content: bytearray, fd: int, ops: list[tuple]) -> None:
    """Run ``ops`` on ``fd`` and on the model ``content``; the first OSError ends them."""
    for op in ops:
        if op[0] == "pwrite":
            _, offset, data = op
            view = memoryview(data)
            while view:  # a short count is POSIX; the rest then gets the error
                written = os.pwrite(fd, view, offset)
                content[len(content):offset] = bytes(max(0, offset - len(content)))
                content[offset:offset + written] = view[:written]
                view, offset = view[written:], offset + written
        elif op[0] == "append":
            view = memoryview(op[1])
            while view:
                written = os.write(fd, view)
                content += view[:written]
                view = view[written:]
        elif op[0] == "ftruncate":
            os.ftruncate(fd, op[1])
            del content[op[1]:]
            content += bytes(op[1] - len(content))


def cases(rng: random.Random) -> list[Case]:
    def blob(n: int) -> bytes:
        return rng.randbytes(n)

    small = blob(MiB + rng.randrange(4096))
    big = blob(3 * MiB + rng.randrange(MiB))  # more than ROOM, less than the whole tmpfs
    over = 4 * MiB  # more than ROOM
    rw, wr = os.O_RDWR, os.O_WRONLY
    return [
        Case("random write before the end", ZONAL, small, rw, [("pwrite", rng.randrange(len(small)), blob(over))],
             finalized=False),
        Case("random write past the end", ZONAL, small, rw, [("pwrite", len(small) + rng.randrange(MiB), blob(over))]),
        Case("O_TRUNC", ZONAL, small, wr | os.O_TRUNC, [("pwrite", 0, blob(over))]),
        Case("ftruncate", ZONAL, small, rw, [("ftruncate", len(small) // 2), ("pwrite", MiB // 3, blob(over))]),
        Case("append to a finalized object", ZONAL, small, wr | os.O_APPEND, [("append", blob(over))]),
        Case("flat bucket, overwrite", FLAT, small, rw, [("pwrite", rng.randrange(len(small)), blob(over))]),
        Case("flat bucket, append", FLAT, small, wr | os.O_APPEND, [("append", blob(over))]),
        Case("flat bucket, new file", FLAT, None, wr | os.O_CREAT | os.O_EXCL, [("append", blob(over))]),
        Case("copy bigger than the free space", ZONAL, big, rw, [("pwrite", rng.randrange(len(big)), blob(4096))],
             sticky=False),
        Case("copy bigger than the free space, ftruncate", ZONAL, big, rw, [("ftruncate", len(big) - 4096)],
             sticky=False),
        Case("copy bigger than the free space, flat bucket", FLAT, big, rw | os.O_APPEND, [("append", blob(10))],
             sticky=False),
        Case("copy of a streamed file", ZONAL, None, rw | os.O_CREAT | os.O_EXCL, [("pwrite", 0, blob(10))],
             sticky=False, before=[("append", big)]),
    ]


@dataclass
class Tally:
    tried: int = 0
    refused: int = 0  # ENOSPC where the goal wants it
    changed: int = 0  # objects whose generation or bytes changed on a refusal
    others: list[str] = field(default_factory=list)  # any other outcome, described
    log_lines: int = 0

    def other(self, what: str) -> None:
        self.others.append(what)


def snapshot(emu: Emulator, bucket: str, name: str):
    info = emu.object_info(bucket, name)
    return None if info is None else (info["generation"], emu.read_object(bucket, name))


def run_case(case: Case, emu: Emulator, mount, name: str, temp_dir: str, tally: Tally, *, full: bool) -> None:
    """Run one case; with ``full``, in a temp dir with only ROOM free."""
    what = f"{case.name} ({name})"
    if case.seed is not None:
        emu.seed(case.bucket, name, case.seed, finalize=case.finalized)
    content = bytearray(case.seed or b"")
    fd = os.open(mount.path / name, case.flags, 0o644)
    try:
        apply(content, fd, case.before)
        os.fsync(fd)
        before = snapshot(emu, case.bucket, name)
        lines = mount.log().count(REFUSED_LINE)
        with filled(temp_dir, ROOM) if full else contextlib.nullcontext():
            refused = errno_of(lambda: apply(content, fd, case.ops))
            synced = errno_of(lambda: os.fsync(fd))
            closed = errno_of(lambda: os.close(fd))
            fd = None
            if full:
                tally.tried += 1
                tally.refused += refused == errno.ENOSPC
                if refused != errno.ENOSPC:
                    tally.other(f"{what}: the write gave {errno_name(refused)}, not ENOSPC")
                want = errno.ENOSPC if case.sticky else None
                if (synced, closed) != (want, want):
                    tally.other(f"{what}: fsync {errno_name(synced)}, close {errno_name(closed)}; "
                                f"expected {errno_name(want)}")
                # The last release comes after close(2): give it time to (wrongly) upload.
                after_release(lambda: snapshot(emu, case.bucket, name) != before, timeout=0.5)
                if snapshot(emu, case.bucket, name) != before:
                    tally.changed += 1
                    tally.other(f"{what}: the object changed")
                elif before is not None and (mount.path / name).read_bytes() != before[1]:
                    tally.other(f"{what}: the mount reads other bytes than the bucket's after the refusal")
                added = mount.log().count(REFUSED_LINE) - lines
                tally.log_lines += added
                if added != 1:
                    tally.other(f"{what}: {added} log lines about the full temp dir, not 1")
            else:
                if (refused, synced, closed) != (None, None, None):
                    tally.other(f"{what} with room: write {errno_name(refused)}, fsync {errno_name(synced)}, "
                                f"close {errno_name(closed)}")
                elif emu.read_object(case.bucket, name) != content:
                    tally.other(f"{what} with room: the bucket does not hold what was written")
    finally:
        if fd is not None:
            os.close(fd)


def log_problems(mount) -> list[str]:
    """Tracebacks and internal errors in the daemon's log: a refusal must be one plain line."""
    log = mount.log()
    count = log.count("Traceback") + log.count("internal error")
    return [f"{count} tracebacks or internal errors in the daemon's log"] if count else []


# ---------------------------------------------------------------- the checks

def test_r8_every_staged_write_refused_with_enospc(report):
    rounds = size(1, 10, env="RAPIDMOUNT_R8_ROUNDS")
    tally = Tally()
    recovered = True
    with tmpfs(TMPFS) as temp_dir, Emulator(buckets={ZONAL: "zonal", FLAT: "flat"}) as emu:
        # TTL 0: objects are seeded behind the mount's back as the cases go.
        flags = ("--temp-dir", temp_dir, "--metadata-ttl", "0", "--negative-ttl", "0")
        with guard.mount(emu, ZONAL, *flags) as zonal, guard.mount(emu, FLAT, *flags) as flat:
            for round_ in range(rounds):
                for index, case in enumerate(cases(random.Random(round_))):
                    mount = zonal if case.bucket == ZONAL else flat
                    name = f"r{round_}-c{index}"
                    run_case(case, emu, mount, name, temp_dir, tally, full=True)
                    others = len(tally.others)
                    run_case(case, emu, mount, name + "-again", temp_dir, tally, full=False)
                    recovered &= len(tally.others) == others
            assert after_release(lambda: free_bytes(temp_dir) >= TMPFS - MiB), "staged copies left in the temp dir"
            tally.others += log_problems(zonal) + log_problems(flat)
    report("R8", f"temp dir full: {tally.tried} staged writes tried in {len(cases(random.Random(0)))} ways, "
                 f"{tally.refused} refused with ENOSPC, {len(tally.others)} other outcomes, "
                 f"{tally.changed} objects changed, {tally.log_lines} log lines, "
                 f"{'recovered' if recovered else 'NOT recovered'} after freeing space")
    assert tally.others == [], "\n".join(tally.others)
    assert tally.refused == tally.tried and tally.changed == 0 and recovered


def test_r8_several_files_staging_at_once_fill_the_dir(report):
    files = size(6, 24, env="RAPIDMOUNT_R8_FILES")
    rng = random.Random(8)
    seeds = {f"many-{i}": rng.randbytes(MiB // 2 + rng.randrange(4096)) for i in range(files)}
    writes = {name: [(rng.randrange(len(seed)), rng.randbytes(2 * MiB)) for _ in range(3)] for name, seed in seeds.items()}
    outcomes: dict[str, tuple] = {}
    with tmpfs(TMPFS) as temp_dir, Emulator(buckets={ZONAL: "zonal"}) as emu:
        before = {name: (emu.seed(ZONAL, name, seed), seed) for name, seed in seeds.items()}
        with guard.mount(emu, ZONAL, "--temp-dir", temp_dir) as m:
            start = threading.Barrier(files)

            def stage(name: str) -> None:
                content = bytearray(seeds[name])
                fd = os.open(m.path / name, os.O_RDWR)
                start.wait()
                ops = [("pwrite", offset, data) for offset, data in writes[name]]
                refused = errno_of(lambda: apply(content, fd, ops))
                synced = errno_of(lambda: os.fsync(fd))
                outcomes[name] = (refused, synced, errno_of(lambda: os.close(fd)), bytes(content))

            threads = [threading.Thread(target=stage, args=(name,)) for name in seeds]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            refused = changed = 0
            others = []
            for name, (wrote, synced, closed, content) in outcomes.items():
                after_release(lambda: snapshot(emu, ZONAL, name) != before[name], timeout=0.2)
                now = snapshot(emu, ZONAL, name)
                if (wrote, synced, closed) == (None, None, None):
                    if now[1] != content:
                        others.append(f"{name}: written in full, but the bucket holds other bytes")
                elif wrote == errno.ENOSPC and synced == closed and synced in (None, errno.ENOSPC):
                    refused += 1
                    changed += now != before[name]
                else:
                    others.append(f"{name}: write {errno_name(wrote)}, fsync {errno_name(synced)}, "
                                  f"close {errno_name(closed)}")
            assert after_release(lambda: free_bytes(temp_dir) >= TMPFS - MiB), "staged copies left in the temp dir"
            # With the room back, the refused files stage and upload as the others did.
            recovered = 0
            for name, (wrote, *_rest) in outcomes.items():
                if wrote is None:
                    continue
                content = bytearray(now_bytes := emu.read_object(ZONAL, name))
                fd = os.open(m.path / name, os.O_RDWR)
                try:
                    apply(content, fd, [("pwrite", offset, data) for offset, data in writes[name]])
                finally:
                    os.close(fd)
                recovered += emu.read_object(ZONAL, name) == bytes(content) != now_bytes
            others += log_problems(m)
    report("R8", f"temp dir full, {files} files staging at once: {refused} refused with ENOSPC, "
                 f"{files - refused - len(others)} written in full, {len(others)} other outcomes, "
                 f"{changed} refused objects changed, {recovered} of {refused} recovered after freeing space")
    assert others == [], "\n".join(others)
    assert refused > 0, "the files all fitted: the check did not fill the temp dir"
    assert changed == 0 and recovered == refused
