"""R3: the write model. Random sequences of file and directory operations run
on one rapidmount mount (zonal bucket) and on a local directory, which serves
as the model. Every step must have the same outcome on both (the same result
or the same errno), and after every step the two trees must hold the same
names, kinds, sizes and bytes. After an fsync, the bucket itself must hold
the file's bytes; with no file open, it must hold the whole tree.

The steps include renames and unlinks of open files (and of directories
holding them), truncation by path and by handle, several handles on one
file, and, in the ``second-writer`` flavour, appends by another client
(taking the object over, as a second writer does) to files this mount has
no handle on. That flavour mounts with a metadata TTL of 0.2 s and lets it
pass after each such append, so the mount sees the other writer's bytes as
any open after the TTL does; the ``cached`` flavour keeps the default TTLs,
where the mount must show its own changes at once.

Short: 15 sequences of up to 25 steps per flavour; soak: 500 of up to 65
(50 on average) per flavour, 1,000 in all (``RAPIDMOUNT_R3_SEQUENCES``,
``RAPIDMOUNT_R3_STEPS``, per flavour).

On a zonal bucket there is no documented difference for the operations used
here. The one place where the bucket and POSIX may disagree without the
specification saying how (renaming a directory over an existing directory:
POSIX replaces an empty one, RenameFolder refuses) is not generated.

Shrinking is off to keep the run short (a failure prints the steps that led
to it); set RAPIDMOUNT_MODEL_SHRINK=1 to get a minimal example.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import pathlib
import random
import time

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard, after_release, write_all
from tests.polling import until
from tests.reliability.conftest import size

BUCKET = "model-bucket"
EXAMPLES = size(15, 500, env="RAPIDMOUNT_R3_SEQUENCES")
# Hypothesis ends a sequence early now and then: up to 65 steps make 50 on average.
STEPS = size(25, 65, env="RAPIDMOUNT_R3_STEPS")
TEST_TIME_LIMIT = size(300, 7200)  # past it the daemon is killed so the test fails instead of hanging
MAX_HANDLES = 3
SECOND_WRITER_TTL = 0.2
_GUARD = HangGuard(TEST_TIME_LIMIT)

FILES = ("a", "b", "d1/a", "d1/b", "d1/d3/c", "d2/a")
DIRS = ("d1", "d2", "d1/d3", "d4")
PATHS = FILES + DIRS
OPEN_FLAGS = {
    "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "r+": os.O_RDWR,
    "x": os.O_RDWR | os.O_CREAT | os.O_EXCL,
}
READABLE = ("w+", "r+", "x")

# Mostly small writes, sometimes a few chunks' worth.
_sizes = st.one_of(st.integers(0, 3000), st.integers(0, 3000), st.integers(0, 3000), st.integers(3001, 300_000))
payloads = st.builds(lambda size, seed: random.Random(seed).randbytes(size), _sizes, st.integers(0, 1 << 16))
offsets = st.integers(0, 400_000)


def _outcome(action):
    """("ok", value) or ("error", errno name): what one side did. Bytes are
    summarised as (length, sha256 prefix) to keep failure messages readable."""
    try:
        value = action()
    except OSError as err:
        return ("error", errno.errorcode.get(err.errno, err.errno))
    if isinstance(value, (bytes, bytearray)):
        value = (f"{len(value)} bytes", hashlib.sha256(value).hexdigest()[:16])
    return ("ok", value)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        assert written > 0, "pwrite() returned 0"
        view, offset = view[written:], offset + written


def _write_file(path: pathlib.Path, flags: int, data: bytes) -> None:
    """open, write, close: the first error wins (a close error after a
    failed write must not hide it)."""
    fd = os.open(path, flags, 0o644)
    try:
        write_all(fd, data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    os.close(fd)


def _read_file(path: pathlib.Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _stat(path: pathlib.Path) -> tuple:
    st_ = os.lstat(path)
    if os.path.isdir(path):
        return ("dir",)
    return ("file", st_.st_size)


def _tree(root: pathlib.Path) -> dict[str, tuple]:
    """rel path -> ("dir",) | ("file", size, sha256 of the bytes read)."""
    out: dict[str, tuple] = {}

    def fail(err: OSError) -> None:
        raise err

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        base = pathlib.Path(dirpath)
        for name in dirnames:
            out[str((base / name).relative_to(root))] = ("dir",)
        for name in filenames:
            path = base / name
            data = _read_file(path)
            size = os.stat(path).st_size
            out[str(path.relative_to(root))] = ("file", size, len(data), hashlib.sha256(data).hexdigest()[:16])
    return out


class Handle:
    """One file opened on both sides; ``path`` follows renames, None once the name is gone."""

    def __init__(self, path: str, mfd: int, lfd: int, mode: str) -> None:
        self.path: str | None = path
        self.mfd, self.lfd, self.mode = mfd, lfd, mode

    def __repr__(self) -> str:
        return f"{self.path!r} ({self.mode})"


def follow_rename(handles, source: str, destination: str) -> None:
    """Handles go with their file, as file descriptors do; a replaced target's
    lose their name. A rename onto itself changes nothing (POSIX)."""
    if source == destination:
        return
    for handle in handles:
        if handle.path == destination or (handle.path or "").startswith(destination + "/"):
            handle.path = None
    for handle in handles:
        if handle.path == source:
            handle.path = destination
        elif handle.path and handle.path.startswith(source + "/"):
            handle.path = destination + handle.path[len(source):]


class WriteModel(RuleBasedStateMachine):
    """One example: a fresh directory on the mount and a fresh local one."""

    emu: Emulator
    mount_root: pathlib.Path
    local_root: pathlib.Path
    second_writer: bool
    examples = itertools.count()
    counts: dict[str, int]

    def __init__(self) -> None:
        super().__init__()
        name = f"ex{next(self.examples):04d}"
        # Made through the emulator: a fresh folder the mount has never looked up.
        self.emu.store.create_folder(BUCKET, name + "/")
        self.prefix = name + "/"
        self.m = self.mount_root / name
        self.l = self.local_root / name
        self.l.mkdir()
        self.handles: dict[int, Handle] = {}
        self.handle_ids = itertools.count()
        self.counts["sequences"] += 1

    def teardown(self) -> None:
        for handle in self.handles.values():
            for fd in (handle.mfd, handle.lfd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.handles.clear()

    def step(self, kind: str) -> None:
        self.counts["steps"] += 1
        self.counts[kind] = self.counts.get(kind, 0) + 1

    # -- running one step on both sides

    def _both(self, label: str, action):
        """``action(root)`` on the mount and on the model; the outcomes must agree."""
        got = _outcome(lambda: action(self.m))
        want = _outcome(lambda: action(self.l))
        assert got == want, f"{label}: the mount gave {got!r}, the local model {want!r}; open: {self._open()}"
        return want

    def _on_handle(self, label: str, handle: Handle, action):
        got, want = _outcome(lambda: action(handle.mfd)), _outcome(lambda: action(handle.lfd))
        assert got == want, (f"{label} on {handle!r}: the mount gave {got!r}, the local model {want!r}; "
                             f"open: {self._open()}")
        return want

    def _open(self) -> list[Handle]:
        return list(self.handles.values())

    def _pick(self, index: int, modes=tuple(OPEN_FLAGS)) -> Handle | None:
        eligible = [handle for _, handle in sorted(self.handles.items()) if handle.mode in modes]
        return eligible[index % len(eligible)] if eligible else None

    def _open_on(self, path: str) -> bool:
        return any(handle.path == path for handle in self.handles.values())

    def _check_durable(self, handle: Handle) -> None:
        """After fsync, the bucket holds exactly the file's bytes (nothing, once its name is gone)."""
        if handle.path is None:
            return
        expected = _read_file(self.l / handle.path)
        info = self.emu.object_info(BUCKET, self.prefix + handle.path)
        assert info is not None, f"fsync of {handle!r}: no object in the bucket"
        assert self.emu.read_object(BUCKET, self.prefix + handle.path) == expected, \
            f"fsync of {handle!r}: the bucket does not hold the synced bytes"

    def _follow_rename(self, source: str, destination: str) -> None:
        follow_rename(self.handles.values(), source, destination)

    @initialize(data=payloads)
    def start_with_some_files(self, data):
        """A few directories and files, so that opens, renames and unlinks meet something."""
        for directory in ("d1", "d1/d3", "d2"):
            self._both(f"mkdir {directory}", lambda root: os.mkdir(root / directory))
        for path in ("a", "d1/a"):
            self._both(f"create {path}", lambda root: _write_file(root / path, os.O_WRONLY | os.O_CREAT, data))

    # -- whole-file operations

    @rule(path=st.sampled_from(FILES), data=payloads)
    def create(self, path, data):
        """open(O_CREAT|O_TRUNC), write, close."""
        self.step("create")
        self._both(f"create {path} ({len(data)} bytes)",
                   lambda root: _write_file(root / path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, data))

    @rule(path=st.sampled_from(FILES), data=payloads)
    def append(self, path, data):
        """open(O_APPEND|O_CREAT), write, close."""
        self.step("append")
        self._both(f"append {len(data)} bytes to {path}",
                   lambda root: _write_file(root / path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, data))

    @rule(path=st.sampled_from(FILES))
    def read(self, path):
        self.step("read")
        self._both(f"read {path}", lambda root: _read_file(root / path))

    @rule(path=st.sampled_from(PATHS + ("",)))
    def stat(self, path):
        self.step("stat")
        self._both(f"stat {path!r}", lambda root: _stat(root / path))

    @rule(path=st.sampled_from(DIRS + ("", "a")))
    def listdir(self, path):
        self.step("listdir")
        self._both(f"listdir {path!r}", lambda root: sorted(os.listdir(root / path)))

    # -- another client

    @precondition(lambda self: self.second_writer)
    @rule(path=st.sampled_from(FILES), data=payloads)
    def second_writer_appends(self, path, data):
        """Another client takes the object over and appends, while this mount has no handle on it."""
        if self._open_on(path) or not (self.l / path).is_file():
            return
        self.step("appends by a second writer")
        expected = _read_file(self.l / path)
        # The last close's release may still be uploading: the other writer comes after it.
        assert after_release(lambda: self.emu.read_object(BUCKET, self.prefix + path) == expected), \
            f"{path!r}: the bucket does not hold the closed file's bytes"
        store, name = self.emu.store, self.prefix + path
        record = store.find_object(BUCKET, name)
        assert record is not None and not record.finalized, f"{path!r}: {record!r} is not appendable"
        writer = store.open_appendable(BUCKET, name, record.generation)
        store.append(BUCKET, name, writer.generation, writer.writer_epoch, writer.size, data)
        with open(self.l / path, "ab") as model:
            model.write(data)
        # What this mount cached of the file expires: stat shows the appended size.
        size = len(expected) + len(data)
        until(lambda: os.stat(self.m / path).st_size == size, 30, f"{path!r}: the second writer's appends")

    # -- open handles

    @precondition(lambda self: len(self.handles) < MAX_HANDLES)
    @rule(path=st.sampled_from(FILES), mode=st.sampled_from(sorted(OPEN_FLAGS)))
    def open_handle(self, path, mode):
        self.step("open")
        flags = OPEN_FLAGS[mode]
        got = _outcome(lambda: os.open(self.m / path, flags, 0o644))
        want = _outcome(lambda: os.open(self.l / path, flags, 0o644))
        if got[0] == want[0] == "ok":
            self.handles[next(self.handle_ids)] = Handle(path, got[1], want[1], mode)
            self.counts["most handles on one file"] = max(
                self.counts.get("most handles on one file", 0),
                sum(handle.path == path for handle in self.handles.values()))
            return
        for side in (got, want):
            if side[0] == "ok":
                os.close(side[1])
        assert got == want, f"open {path!r} ({mode}): the mount gave {got!r}, the local model {want!r}"

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, MAX_HANDLES - 1), data=payloads, offset=st.one_of(st.none(), offsets))
    def write(self, index, data, offset):
        """write() at the file position, or pwrite() anywhere (even past the end)."""
        handle = self._pick(index)
        self.step("write")
        if offset is None or handle.mode == "a":  # pwrite on O_APPEND appends on Linux: not interesting
            self._on_handle(f"write {len(data)} bytes", handle, lambda fd: write_all(fd, data))
        else:
            at = min(offset, os.fstat(handle.lfd).st_size + 1000)
            self._on_handle(f"pwrite {len(data)} bytes at {at}", handle, lambda fd: _pwrite_all(fd, data, at))

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, MAX_HANDLES - 1), datasync=st.booleans())
    def fsync(self, index, datasync):
        handle = self._pick(index)
        self.step("fsync")
        sync = os.fdatasync if datasync else os.fsync
        if self._on_handle("fdatasync" if datasync else "fsync", handle, sync)[0] == "ok":
            self._check_durable(handle)

    @precondition(lambda self: any(handle.mode in READABLE for handle in self.handles.values()))
    @rule(index=st.integers(0, MAX_HANDLES - 1), offset=offsets, length=st.integers(0, 300_000))
    def read_handle(self, index, offset, length):
        handle = self._pick(index, READABLE)
        self.step("pread")
        self._on_handle(f"pread {length} at {offset}", handle, lambda fd: os.pread(fd, length, offset))

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, MAX_HANDLES - 1), size=offsets)
    def ftruncate(self, index, size):
        handle = self._pick(index)
        self.step("ftruncate")
        self._on_handle(f"ftruncate to {size}", handle, lambda fd: os.ftruncate(fd, size))

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, MAX_HANDLES - 1))
    def close_handle(self, index):
        handle = self._pick(index)
        self.step("close")
        del self.handles[next(key for key, value in self.handles.items() if value is handle)]
        got, want = _outcome(lambda: os.close(handle.mfd)), _outcome(lambda: os.close(handle.lfd))
        assert got == want, f"close {handle!r}: the mount gave {got!r}, the local model {want!r}"

    # -- namespace (open files included: they follow renames and outlive unlinks, as in POSIX)

    @rule(path=st.sampled_from(PATHS), size=offsets)
    def truncate(self, path, size):
        self.step("truncate")
        self._both(f"truncate {path} to {size}", lambda root: os.truncate(root / path, size))

    @rule(source=st.sampled_from(PATHS), destination=st.sampled_from(PATHS))
    def rename(self, source, destination):
        if source != destination and (self.l / source).is_dir() and (self.l / destination).is_dir():
            return  # not specified for buckets (see the module docstring)
        self.step("rename of an open file" if self._open_on(source) else "rename")
        if self._both(f"rename {source} -> {destination}",
                      lambda root: os.rename(root / source, root / destination))[0] == "ok":
            self._follow_rename(source, destination)

    @rule(path=st.sampled_from(PATHS))
    def unlink(self, path):
        self.step("unlink of an open file" if self._open_on(path) else "unlink")
        if self._both(f"unlink {path}", lambda root: os.unlink(root / path))[0] == "ok":
            for handle in self.handles.values():
                if handle.path == path:
                    handle.path = None

    @rule(path=st.sampled_from(PATHS))
    def mkdir(self, path):
        self.step("mkdir")
        self._both(f"mkdir {path}", lambda root: os.mkdir(root / path))

    @rule(path=st.sampled_from(PATHS))
    def rmdir(self, path):
        self.step("rmdir")
        self._both(f"rmdir {path}", lambda root: os.rmdir(root / path))

    # -- after every step

    @invariant()
    def bucket_holds_the_tree_when_nothing_is_open(self):
        """close flushes: with no handle open, the bucket holds exactly the
        model's files (as objects) and directories (as folders). A truncation
        alone (O_TRUNC or ftruncate, nothing written after it) is uploaded by
        the release the kernel sends right after close() returned: the check
        waits a few seconds for it."""
        if self.handles:
            return
        files, dirs = {}, set()
        for dirpath, dirnames, filenames in os.walk(self.l):
            base = pathlib.Path(dirpath)
            dirs.update(str((base / name).relative_to(self.l)) for name in dirnames)
            for name in filenames:
                files[str((base / name).relative_to(self.l))] = _read_file(base / name)
        after_release(lambda: not self._bucket_differs(files, dirs))
        difference = self._bucket_differs(files, dirs)
        assert not difference, difference

    def _bucket_differs(self, files: dict[str, bytes], dirs: set[str]) -> str | None:
        listing = self.emu.store.list_objects(BUCKET, prefix=self.prefix)
        objects = {record.name[len(self.prefix):] for record in listing.objects}
        if objects != set(files):
            return f"objects in the bucket {sorted(objects)} != files {sorted(files)}"
        for rel, data in files.items():
            if self.emu.read_object(BUCKET, self.prefix + rel) != data:
                return f"the object {rel!r} differs"
        folders = {record.name[len(self.prefix):-1]
                   for record in self.emu.store.list_folders(BUCKET, prefix=self.prefix).folders
                   if record.name != self.prefix}
        if folders != dirs:
            return f"folders in the bucket {sorted(folders)} != directories {sorted(dirs)}"
        return None

    @invariant()
    def same_tree(self):
        got, want = _tree(self.m), _tree(self.l)
        if got != want:
            differing = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            detail = {k: {"mount": got.get(k), "local": want.get(k)} for k in differing}
            raise AssertionError(f"the trees differ (file: size, bytes read, sha256): {detail}; "
                                 f"open: {self._open()}")


FLAVOURS = {
    "cached": ((), False),
    "second-writer": (("--metadata-ttl", str(SECOND_WRITER_TTL)), True),
}


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_r3_mount_behaves_like_a_local_directory(flavour, report, tmp_path):
    flags, second_writer = FLAVOURS[flavour]
    counts = {"sequences": 0, "steps": 0}
    WriteModel.emu, WriteModel.local_root = None, tmp_path
    WriteModel.second_writer, WriteModel.counts = second_writer, counts
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if os.environ.get("RAPIDMOUNT_MODEL_SHRINK") == "1":
        phases.append(Phase.shrink)
    started = time.monotonic()
    divergence = None
    with Emulator(buckets={BUCKET: "zonal"}) as emu, \
            _GUARD.mount(emu, BUCKET, "--retry-deadline", "20", *flags) as mount:
        WriteModel.emu, WriteModel.mount_root = emu, mount.path
        try:
            with _GUARD.armed():  # a hang kills the daemon: pending syscalls fail with ENOTCONN
                run_state_machine_as_test(WriteModel, settings=settings(
                    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, phases=phases,
                    suppress_health_check=list(HealthCheck), print_blob=True, database=None))
        except AssertionError as err:
            divergence = err
    kinds = ", ".join(f"{counts[kind]} {kind}" for kind in sorted(counts) if kind not in ("sequences", "steps"))
    report("R3", f"write model ({flavour}): {counts['sequences']} sequences, {counts['steps']} steps in "
                 f"{time.monotonic() - started:.0f}s ({kinds}): {int(divergence is not None)} divergences")
    if divergence is not None:
        raise divergence


def test_r3_a_rename_onto_itself_keeps_the_names_of_open_files():
    """Found by the R3 soak: the model took ``rename d2 -> d2`` for a
    replacement and dropped the name of a file open below d2, then let the
    second writer append to that file while this mount still had it open."""
    below, same = Handle("d2/a", -1, -1, "a"), Handle("d2", -1, -1, "r+")
    follow_rename([below, same], "d2", "d2")
    assert (below.path, same.path) == ("d2/a", "d2")
    follow_rename([below, same], "d2", "d5")
    assert (below.path, same.path) == ("d5/a", "d5")
    follow_rename([below], "b", "d5/a")
    assert below.path is None
