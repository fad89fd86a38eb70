"""Model-based test of the write path: random sequences of file and directory
operations run on one rapidmount mount (zonal bucket) and on a local
directory, which serves as the model. Every step must have the same outcome
on both (the same result or the same errno), and after every step the two
trees must hold the same names, kinds, sizes and bytes. After an fsync, the
bucket itself must hold the file's bytes.

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

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard, after_release, write_all

BUCKET = "model-bucket"
EXAMPLES = 25
STEPS = 25
TEST_TIME_LIMIT = 240.0  # past it the daemon is killed so the test fails instead of hanging
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


class WriteModel(RuleBasedStateMachine):
    """One example: a fresh directory on the mount and a fresh local one."""

    emu: Emulator
    mount_root: pathlib.Path
    local_root: pathlib.Path
    examples = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        name = f"ex{next(self.examples):03d}"
        # Made through the emulator: a fresh folder the mount has never looked up.
        self.emu.store.create_folder(BUCKET, name + "/")
        self.prefix = name + "/"
        self.m = self.mount_root / name
        self.l = self.local_root / name
        self.l.mkdir()
        # path -> (mount fd, local fd, mode); at most two, on different paths
        self.handles: dict[str, tuple[int, int, str]] = {}

    def teardown(self) -> None:
        for mfd, lfd, _ in self.handles.values():
            for fd in (mfd, lfd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.handles.clear()

    # -- running one step on both sides

    def _both(self, label: str, action):
        """``action(root)`` on the mount and on the model; the outcomes must agree."""
        got = _outcome(lambda: action(self.m))
        want = _outcome(lambda: action(self.l))
        assert got == want, f"{label}: the mount gave {got!r}, the local model {want!r}"
        return want

    def _on_handles(self, label: str, path: str, action):
        mfd, lfd, mode = self.handles[path]
        got, want = _outcome(lambda: action(mfd)), _outcome(lambda: action(lfd))
        assert got == want, f"{label} on {path!r} ({mode}): the mount gave {got!r}, the local model {want!r}"
        return want

    def _pick(self, index: int, modes=tuple(OPEN_FLAGS)) -> str | None:
        eligible = sorted(path for path, (_, _, mode) in self.handles.items() if mode in modes)
        return eligible[index % len(eligible)] if eligible else None

    def _check_durable(self, path: str) -> None:
        """After fsync, the bucket holds exactly the file's bytes."""
        expected = _read_file(self.l / path)
        info = self.emu.object_info(BUCKET, self.prefix + path)
        assert info is not None, f"fsync of {path!r}: no object in the bucket"
        assert self.emu.read_object(BUCKET, self.prefix + path) == expected, \
            f"fsync of {path!r}: the bucket does not hold the synced bytes"

    # -- whole-file operations

    @rule(path=st.sampled_from(FILES), data=payloads)
    def create(self, path, data):
        """open(O_CREAT|O_TRUNC), write, close."""
        if path in self.handles:
            return
        self._both(f"create {path} ({len(data)} bytes)",
                   lambda root: _write_file(root / path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, data))

    @rule(path=st.sampled_from(FILES), data=payloads)
    def append(self, path, data):
        """open(O_APPEND|O_CREAT), write, close."""
        if path in self.handles:
            return
        self._both(f"append {len(data)} bytes to {path}",
                   lambda root: _write_file(root / path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, data))

    @rule(path=st.sampled_from(FILES))
    def read(self, path):
        self._both(f"read {path}", lambda root: _read_file(root / path))

    @rule(path=st.sampled_from(PATHS + ("",)))
    def stat(self, path):
        self._both(f"stat {path!r}", lambda root: _stat(root / path))

    @rule(path=st.sampled_from(DIRS + ("", "a")))
    def listdir(self, path):
        self._both(f"listdir {path!r}", lambda root: sorted(os.listdir(root / path)))

    # -- open handles

    @precondition(lambda self: len(self.handles) < 2)
    @rule(path=st.sampled_from(FILES), mode=st.sampled_from(sorted(OPEN_FLAGS)))
    def open_handle(self, path, mode):
        if path in self.handles:
            return
        flags = OPEN_FLAGS[mode]
        got = _outcome(lambda: os.open(self.m / path, flags, 0o644))
        want = _outcome(lambda: os.open(self.l / path, flags, 0o644))
        if got[0] == want[0] == "ok":
            self.handles[path] = (got[1], want[1], mode)
            return
        for side in (got, want):
            if side[0] == "ok":
                os.close(side[1])
        assert got == want, f"open {path!r} ({mode}): the mount gave {got!r}, the local model {want!r}"

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, 1), data=payloads, offset=st.one_of(st.none(), offsets))
    def write(self, index, data, offset):
        """write() at the file position, or pwrite() anywhere (even past the end)."""
        path = self._pick(index)
        mode = self.handles[path][2]
        if offset is None or mode == "a":  # pwrite on O_APPEND appends on Linux: not interesting
            self._on_handles(f"write {len(data)} bytes", path, lambda fd: write_all(fd, data))
        else:
            at = min(offset, os.fstat(self.handles[path][1]).st_size + 1000)
            self._on_handles(f"pwrite {len(data)} bytes at {at}", path, lambda fd: _pwrite_all(fd, data, at))

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, 1), datasync=st.booleans())
    def fsync(self, index, datasync):
        path = self._pick(index)
        sync = os.fdatasync if datasync else os.fsync
        if self._on_handles("fdatasync" if datasync else "fsync", path, sync)[0] == "ok":
            self._check_durable(path)

    @precondition(lambda self: any(mode in READABLE for _, _, mode in self.handles.values()))
    @rule(index=st.integers(0, 1), offset=offsets, length=st.integers(0, 300_000))
    def read_handle(self, index, offset, length):
        path = self._pick(index, READABLE)
        self._on_handles(f"pread {length} at {offset}", path, lambda fd: os.pread(fd, length, offset))

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, 1), size=offsets)
    def ftruncate(self, index, size):
        path = self._pick(index)
        self._on_handles(f"ftruncate to {size}", path, lambda fd: os.ftruncate(fd, size))

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, 1))
    def close_handle(self, index):
        path = self._pick(index)
        mfd, lfd, mode = self.handles.pop(path)
        got, want = _outcome(lambda: os.close(mfd)), _outcome(lambda: os.close(lfd))
        assert got == want, f"close {path!r} ({mode}): the mount gave {got!r}, the local model {want!r}"

    # -- namespace (no handle open, so that no open file is renamed or removed)

    @precondition(lambda self: not self.handles)
    @rule(path=st.sampled_from(PATHS), size=offsets)
    def truncate(self, path, size):
        self._both(f"truncate {path} to {size}", lambda root: os.truncate(root / path, size))

    @precondition(lambda self: not self.handles)
    @rule(source=st.sampled_from(PATHS), destination=st.sampled_from(PATHS))
    def rename(self, source, destination):
        if source != destination and (self.l / source).is_dir() and (self.l / destination).is_dir():
            return  # not specified for buckets (see the module docstring)
        self._both(f"rename {source} -> {destination}",
                   lambda root: os.rename(root / source, root / destination))

    @precondition(lambda self: not self.handles)
    @rule(path=st.sampled_from(PATHS))
    def unlink(self, path):
        self._both(f"unlink {path}", lambda root: os.unlink(root / path))

    @rule(path=st.sampled_from(PATHS))
    def mkdir(self, path):
        self._both(f"mkdir {path}", lambda root: os.mkdir(root / path))

    @rule(path=st.sampled_from(PATHS))
    def rmdir(self, path):
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
            raise AssertionError(f"the trees differ (file: size, bytes read, sha256): {detail}")


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def mount(emu):
    with _GUARD.mount(emu, BUCKET, "--retry-deadline", "20") as m:
        yield m


def test_mount_behaves_like_a_local_directory(emu, mount, tmp_path):
    WriteModel.emu, WriteModel.mount_root, WriteModel.local_root = emu, mount.path, tmp_path
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if os.environ.get("RAPIDMOUNT_MODEL_SHRINK") == "1":
        phases.append(Phase.shrink)
    with _GUARD.armed():  # a hang kills the daemon: pending syscalls fail with ENOTCONN
        run_state_machine_as_test(WriteModel, settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, phases=phases,
            suppress_health_check=list(HealthCheck), print_blob=True))
