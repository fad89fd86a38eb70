"""Coherence with another writer and with the mount's own changes.

Each test reproduces, as a new user would, a way a mount can lose another
writer's data or show stale state: a real mount against the emulator, and Google's official client
(google-cloud-storage's AsyncAppendableObjectWriter on the zonal bucket, the
GAPIC ``WriteObject`` upload on the flat one) as the other writer.

- A mutation (``rm``, ``truncate``, ``mv``, ``utime``) of a file another
  client replaced fails with ESTALE, changes nothing in the bucket, and
  drops the mount's stale entry, whichever way the mount knew the file.
- The mount sees its own renames and appends at once.
- mtimes set by ``touch -d``, ``cp -a`` and ``tar -x`` reach the bucket.
- Small ones: ESTALE for a read after unlink, a quiet EEXIST from ``mkdir``,
  a clear EINVAL for CR/LF in names, and modes kept with ``--preserve-mode``.
"""

from __future__ import annotations

import asyncio
import calendar
import errno
import io
import os
import pathlib
import re
import stat
import subprocess
import tarfile
import time

import google_crc32c
import pytest

from tests.conftest import make_official_client
from tests.mountutil import assert_errno, errno_name, errno_of, payload, write_all
from tests.mount.test_write import (  # noqa: F401 (emu and _hang_guard are fixtures)
    BUCKET, FLAT, HNS, KINDS, MTIME_KEY, _hang_guard, _mount, _rfc3339_ns, _workdir, emu, mount_per_bucket)

MiB = 1 << 20
THEIRS = b"v2-external"
MODE_KEY = "mode"  # rclone's key: the st_mode as an octal string, e.g. "100755"
BUCKETS = [BUCKET, FLAT]
BUCKET_IDS = ["zonal", "flat"]


# ---------------------------------------------------------------- the other writer

def _run_async(scenario):
    return asyncio.run(scenario())


def official_write(endpoint: str, bucket: str, name: str, data: bytes,
                   metadata: dict[str, str] | None = None) -> int:
    """Write ``name`` = ``data`` as a new generation through Google's client; its generation.

    Zonal buckets: a new appendable object (AsyncAppendableObjectWriter with
    no generation), then ``UpdateObject`` for metadata. Other buckets: one
    ``WriteObject`` upload carrying the metadata.
    """
    from google.cloud import _storage_v2 as S
    from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter
    from google.protobuf import field_mask_pb2

    parent = f"projects/_/buckets/{bucket}"

    async def zonal() -> int:
        client = make_official_client(endpoint)  # bound to this loop
        writer = AsyncAppendableObjectWriter(client, bucket, name)
        await writer.open()
        await writer.append(data)
        await writer.flush()
        await writer.close()
        generation = writer.generation
        if metadata:
            await client.grpc_client.update_object(request=S.UpdateObjectRequest(
                object_=S.Object(bucket=parent, name=name, generation=generation, metadata=metadata),
                update_mask=field_mask_pb2.FieldMask(paths=["metadata"])))
        return generation

    async def regional() -> int:
        client = make_official_client(endpoint)
        crc = google_crc32c.value(data)

        async def requests():
            yield S.WriteObjectRequest(
                write_object_spec=S.WriteObjectSpec(resource=S.Object(bucket=parent, name=name,
                                                                      metadata=metadata or {})),
                write_offset=0, checksummed_data=S.ChecksummedData(content=data, crc32c=crc),
                object_checksums=S.ObjectChecksums(crc32c=crc), finish_write=True)

        response = await (await client.grpc_client.write_object(requests=requests()))
        return response.resource.generation

    return _run_async(zonal if KINDS[bucket] == "zonal" else regional)


def official_make_dir(endpoint: str, bucket: str, folder: str) -> None:
    """A directory made by Google's clients: ``CreateFolder`` (storage control) on
    buckets with folders, a zero-byte placeholder object ``folder`` elsewhere."""
    if KINDS[bucket] == "flat":
        official_write(endpoint, bucket, folder, b"")
        return
    import grpc
    from google.cloud import storage_control_v2
    from google.cloud.storage_control_v2.services.storage_control.transports.grpc_asyncio import (
        StorageControlGrpcAsyncIOTransport)

    async def scenario() -> None:
        transport = StorageControlGrpcAsyncIOTransport(channel=grpc.aio.insecure_channel(endpoint))
        control = storage_control_v2.StorageControlAsyncClient(transport=transport)
        await control.create_folder(parent=f"projects/_/buckets/{bucket}", folder_id=folder,
                                    folder=storage_control_v2.Folder())

    _run_async(scenario)


# ---------------------------------------------------------------- helpers

def _sh(command: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL, **options)


def _ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}: {result.stderr!r}"
    return result


def _q(path) -> str:
    """``path`` quoted for sh."""
    return "'" + str(path).replace("'", "'\\''") + "'"


def _seen(path: pathlib.Path) -> tuple:
    """What the mount shows at ``path``: ("file", size, bytes), or (call, errno name) of
    the first call that failed."""
    try:
        size = os.stat(path).st_size
    except OSError as err:
        return ("stat", errno_name(err.errno))
    try:
        data = path.read_bytes()
    except OSError as err:
        return ("read", errno_name(err.errno), "stat size", size)
    return ("file", size, data)


def _shows_soon(path: pathlib.Path, data: bytes, within: float) -> tuple:
    """Poll ``_seen(path)`` until it shows ``data``; the last view."""
    want = ("file", len(data), data)
    deadline = time.monotonic() + within
    while True:
        seen = _seen(path)
        if seen == want or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


def _new_log(m, before: str) -> list[str]:
    text = m.log()
    return text[len(before):].splitlines() if text.startswith(before) else text.splitlines()


def _levels(lines: list[str], *levels: str) -> list[str]:
    return [line for line in lines if any(f" {level} " in line for level in levels)]


# ---------------------------------------------------------------- fixtures

bucket_mount, work = mount_per_bucket(BUCKETS, BUCKET_IDS)


def _know(emu, work, how: str, name: str) -> None:
    """Make the mount know ``name`` = "v1" the way ``how`` says."""
    path = work.path / name
    if how == "written":  # echo v1 > M/f; stat M/f
        _ok(_sh(f"echo v1 > {_q(path)}"))
    else:
        emu.seed(work.bucket, work.obj(name), b"v1\n")
        if how == "listed":
            assert os.listdir(work.path) == [name]
    assert os.stat(path).st_size == 3
    assert emu.read_object(work.bucket, work.obj(name)) == b"v1\n"


KNOWN = ["written", "listed", "looked_up"]
OLD_MTIME_NS = 1_234_567_890 * 1_000_000_000


# ---------------------------------------------------------------- 1. every mutation is conditional

MUTATIONS = {
    "unlink": lambda path: os.unlink(path),
    "truncate": lambda path: os.truncate(path, 1),
    "rename": lambda path: os.rename(path, path.with_name("f.moved")),
    "utime": lambda path: os.utime(path, ns=(OLD_MTIME_NS, OLD_MTIME_NS)),
}


@pytest.mark.parametrize("known", KNOWN)
@pytest.mark.parametrize("op", list(MUTATIONS))
def test_mutation_of_a_file_another_client_replaced_is_estale(emu, work, op, known):
    """Regression: for a file written through the mount, rm deletes, truncate corrupts,
    mv moves, and utime rewrites the metadata of another client's new generation.

    Whichever way the mount knew f, the mutation must fail with ESTALE, leave
    the other client's object as it is, and drop the mount's stale entry.
    Linux retries a path call that failed with ESTALE once, with a fresh
    lookup (``retry_estale``): dropping the entry must not let that retry
    change the new generation."""
    path = work.path / "f"
    _know(emu, work, known, "f")
    theirs = official_write(emu.endpoint, work.bucket, work.obj("f"), THEIRS)
    before = emu.object_info(work.bucket, work.obj("f"))
    assert before["generation"] == theirs

    got = errno_of(lambda: MUTATIONS[op](path))
    after = emu.object_info(work.bucket, work.obj("f"))
    assert after is not None, f"{op} ({errno_name(got)}) destroyed the other client's object"
    assert emu.read_object(work.bucket, work.obj("f")) == THEIRS, \
        f"{op} ({errno_name(got)}) changed the other client's bytes"
    assert (after["generation"], after["metageneration"], after["metadata"]) == \
        (before["generation"], before["metageneration"], before["metadata"]), \
        f"{op} ({errno_name(got)}) changed the other client's object"
    if op == "rename":
        assert emu.object_info(work.bucket, work.obj("f.moved")) is None, "mv moved the other client's object"
    assert got == errno.ESTALE, f"{op} of a replaced file: expected ESTALE, got {errno_name(got)}"

    # The refusal dropped the stale entry: the mount shows the other client's object.
    seen = _shows_soon(path, THEIRS, within=1.0)
    assert seen == ("file", len(THEIRS), THEIRS), f"after the ESTALE the mount still shows {seen}"
    if op == "rename":
        assert not os.path.lexists(path.with_name("f.moved")), "the failed mv left a target in the mount"


@pytest.mark.parametrize("size", [1, 0])
@pytest.mark.parametrize("known", KNOWN)
def test_coreutils_truncate_of_a_replaced_file_is_estale(emu, work, known, size):
    """Guard: coreutils ``truncate -s N`` opens and ftruncates; over another
    client's replacement it fails with ESTALE. To size 0 nothing is copied
    and the close uploads nothing (a truncation alone): the close still
    checks the object and reports the conflict."""
    path = work.path / "f"
    _know(emu, work, known, "f")
    official_write(emu.endpoint, work.bucket, work.obj("f"), THEIRS)
    result = _sh(f"truncate -s {size} {_q(path)}")
    assert result.returncode != 0 and b"Stale file handle" in result.stderr, \
        f"truncate -s {size} exited {result.returncode}: {result.stderr!r}"
    assert emu.read_object(work.bucket, work.obj("f")) == THEIRS


# ---------------------------------------------------------------- 2. the mount sees its own changes

@pytest.mark.parametrize("first_write", ["append", "pwrite-past-end"])
def test_file_renamed_while_open_for_writing_reads_at_once_under_its_new_name(emu, work, first_write):
    """Regression: after a file open for writing is renamed and closed, ``cat NEW``
    fails with ESTALE for about 60 s: the cached entry keeps the pre-move
    generation (NOT_FOUND: generation ... of object 'NEW' does not exist)."""
    first, second = payload(3 * MiB + 5, 1), payload(MiB + 77, 2)
    old, new = work.path / "c2", work.path / "c2.new"
    fd = os.open(old, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if first_write == "pwrite-past-end":  # not an append: the file is staged
            os.pwrite(fd, b"x", 5)
            os.ftruncate(fd, 0)
        write_all(fd, first)
        _ok(subprocess.run(["mv", str(old), str(new)], capture_output=True, timeout=60))
        write_all(fd, second)
    finally:
        os.close(fd)
    assert emu.read_object(work.bucket, work.obj("c2.new")) == first + second
    result = subprocess.run(["cat", str(new)], capture_output=True, timeout=60)
    assert result.returncode == 0, f"cat NEW right after close: {result.stderr!r}"
    assert result.stdout == first + second, "cat NEW returned other bytes"
    assert not os.path.lexists(old)


@pytest.mark.parametrize("head", [0, MiB], ids=["unread", "partly-read"])
def test_reader_opened_before_mv_reads_the_right_bytes(emu, work, head):
    """Regression: a reader opened before a plain ``mv`` gets ESTALE."""
    data = payload(6 * MiB + 3, 3)
    emu.seed(work.bucket, work.obj("r"), data)
    with open(work.path / "r", "rb", buffering=0) as reader:
        got = reader.read(head) if head else b""
        _ok(subprocess.run(["mv", str(work.path / "r"), str(work.path / "r.moved")],
                           capture_output=True, timeout=60))
        try:
            while chunk := reader.read(MiB):
                got += chunk
        except OSError as err:
            pytest.fail(f"read after mv at offset {len(got)}: {errno_name(err.errno)}")
    assert len(got) == len(data) and got == data, "the reader got other bytes"
    assert (work.path / "r.moved").read_bytes() == data


def test_own_appends_keep_the_size_fresh_while_a_reader_streams(emu, work, tmp_path):
    """Regression: while a reader streams a file, 20 ``cat chunk >> M/big`` run; stat on
    the same mount then reports the old size for more than 30 s. And the reader,
    past its open's size, must get the appended bytes (once it got zeros)."""
    big = work.path / "big"
    base = payload(4 * MiB, 4)
    big.write_bytes(base)
    chunk = payload(100_000, 5)
    local = tmp_path / "chunk"
    local.write_bytes(chunk)
    with open(big, "rb", buffering=0) as reader:
        streamed = reader.read(256 * 1024)
        for _ in range(20):
            _ok(_sh(f"cat {_q(local)} >> {_q(big)}"))
            streamed += reader.read(256 * 1024)
        expected = base + chunk * 20
        assert emu.read_object(work.bucket, work.obj("big")) == expected
        deadline = time.monotonic() + 2.0
        while (size := os.stat(big).st_size) != len(expected) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert size == len(expected), f"stat on the appending mount: {size}, the bucket: {len(expected)}"
        # The kernel learnt the new size from the appends, so it reads on past
        # the old end: those READs get the appended bytes, never zeros (on a
        # zonal bucket the reader's generation grew; on a flat one each append
        # made a new generation, which the reader follows as this mount's own).
        assert len(streamed) == 21 * 256 * 1024 and streamed == expected[:len(streamed)]
    assert big.read_bytes() == expected


def test_a_reader_open_across_this_mounts_rewrite_never_hands_old_pages_to_a_new_open(emu, work):
    """One inode, one page cache: a reader opened before this mount rewrote the
    file must not read the old generation after it, or its READs put old
    bytes in the pages a reader opened after the rewrite then gets."""
    path = work.path / "rewritten"
    old, new = payload(8 * MiB, 11), payload(8 * MiB, 12)
    path.write_bytes(old)
    before = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(before, MiB, 0) == old[:MiB]
        with open(path, "r+b") as f:  # the same inode, other bytes
            f.write(new)
        after = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(after, MiB, 0) == new[:MiB]
            assert os.pread(before, MiB, 6 * MiB) == new[6 * MiB:7 * MiB], "the first reader read the old bytes"
            assert os.pread(after, MiB, 6 * MiB) == new[6 * MiB:7 * MiB], "old bytes reached the new open"
        finally:
            os.close(after)
    finally:
        os.close(before)
    assert emu.read_object(work.bucket, work.obj("rewritten")) == new


# ---------------------------------------------------------------- 3. mtimes survive

def _utc_ns(text: str, fraction_ns: int = 0) -> int:
    return calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")) * 1_000_000_000 + fraction_ns


def _touch_d(work, tmp_path) -> dict[str, tuple[int, int]]:
    _ok(subprocess.run(["touch", "-d", "2001-02-03 04:05:06.123456789", str(work.path / "x")],
                       capture_output=True, timeout=60, env={**os.environ, "TZ": "UTC"}))
    return {"x": (_utc_ns("2001-02-03 04:05:06", 123_456_789), 1)}


def _cp_a(work, tmp_path) -> dict[str, tuple[int, int]]:
    source = tmp_path / "old.bin"
    source.write_bytes(payload(300_000, 6))
    mtime_ns = _utc_ns("1999-12-31 23:59:58", 987_654_321)
    os.utime(source, ns=(mtime_ns, mtime_ns))
    if os.stat(source).st_mtime_ns != mtime_ns:  # a local file system without nanoseconds
        mtime_ns = os.stat(source).st_mtime_ns
    _ok(subprocess.run(["cp", "-a", str(source), str(work.path)], capture_output=True, timeout=60))
    return {"old.bin": (mtime_ns, 1)}


def _tar_x(work, tmp_path) -> dict[str, tuple[int, int]]:
    archive = tmp_path / "old.tar"
    expected = {}
    with tarfile.open(archive, "w") as tar:
        for index, name in enumerate(["a.txt", "b.bin"]):
            data = payload(1000 + 50_000 * index, 7 + index)
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o644
            member.mtime = 946_684_800 + 86_400 * index  # 2000-01-01, -02
            tar.addfile(member, io.BytesIO(data))
            expected[name] = (member.mtime * 1_000_000_000, 1_000_000_000)  # ustar: whole seconds
    _ok(subprocess.run(["tar", "-xf", str(archive), "-C", str(work.path)], capture_output=True, timeout=60))
    return expected


MTIME_TOOLS = {"touch-d": _touch_d, "cp-a": _cp_a, "tar-x": _tar_x}


@pytest.mark.parametrize("tool", list(MTIME_TOOLS))
def test_mtimes_set_by_tools_survive_in_a_fresh_mount(emu, work, tmp_path, tool):
    """Regression: ``touch -d``, ``cp -a`` and ``tar -x`` set the mtime on the open
    descriptor, which is kept only in memory: the bucket and a fresh mount
    never see it."""
    expected = MTIME_TOOLS[tool](work, tmp_path)
    for name, (mtime_ns, unit) in expected.items():
        assert os.stat(work.path / name).st_mtime_ns // unit == mtime_ns // unit, f"{name} on this mount"
    with _mount(emu, work.bucket) as fresh:  # a new daemon, cold caches
        for name, (mtime_ns, unit) in expected.items():
            got = os.stat(fresh.path / work.rel / name).st_mtime_ns
            assert got // unit == mtime_ns // unit, \
                f"{tool}: {name} in a fresh mount has mtime {got}, expected {mtime_ns}"
    for name, (mtime_ns, unit) in expected.items():
        info = emu.object_info(work.bucket, work.obj(name))
        assert info is not None, f"{name} is not in the bucket"
        assert MTIME_KEY in info["metadata"], f"{tool}: {name} has no {MTIME_KEY}: {info['metadata']}"
        assert _rfc3339_ns(info["metadata"][MTIME_KEY]) // unit == mtime_ns // unit


# ---------------------------------------------------------------- 4. smaller ones

def test_read_after_unlink_is_estale(emu, work):
    """The doc says ENOENT on non-zonal buckets; the handle's pinned generation is
    gone, so the answer is ESTALE on every bucket (the doc is to say so)."""
    data = payload(4 * MiB, 8)
    emu.seed(work.bucket, work.obj("gone"), data)
    fd = os.open(work.path / "gone", os.O_RDONLY)
    try:
        os.unlink(work.path / "gone")
        assert emu.object_info(work.bucket, work.obj("gone")) is None
        assert_errno(lambda: os.pread(fd, 4096, 0), errno.ESTALE, "read after unlink")
    finally:
        os.close(fd)


@pytest.mark.parametrize("made", ["pyc-inside", "dir"])
def test_mkdir_of_a_directory_made_elsewhere_is_a_quiet_eexist(emu, bucket_mount, work, made):
    """Regression: mkdir of an existing ``__pycache__`` (made by another client after the
    mount cached it as missing) logs an ERROR line for an ordinary EEXIST.

    The other client writes ``__pycache__/mod.pyc`` (an implicit directory on
    flat buckets), or makes the directory itself (a folder, or on flat buckets
    the placeholder object ``__pycache__/``)."""
    _, m = bucket_mount
    target = work.path / "__pycache__"
    assert_errno(lambda: os.stat(target), errno.ENOENT, "before the other client")
    if made == "pyc-inside":
        official_write(emu.endpoint, work.bucket, work.obj("__pycache__/mod.cpython-311.pyc"), b"pyc")
    else:
        official_make_dir(emu.endpoint, work.bucket, work.obj("__pycache__/"))
    before = m.log()
    assert_errno(lambda: os.mkdir(target), errno.EEXIST, "mkdir of a directory made elsewhere")
    # Whatever a request logs, in the daemon or its workers, is written before its answer.
    errors = _levels(_new_log(m, before), "ERROR", "CRITICAL")
    assert errors == [], "an ordinary EEXIST logged:\n" + "\n".join(errors)


_REASON = re.compile(r"newline|new line|line ?feed|carriage return|\bCR\b|\bLF\b|\\n|\\r", re.IGNORECASE)


@pytest.mark.parametrize("name", ["a\nb", "a\rb"], ids=["LF", "CR"])
def test_name_with_cr_or_lf_is_a_clear_einval(emu, bucket_mount, work, name):
    """Regression: the service refuses CR/LF in object names. ``touch $'a\\nb'`` must
    give EINVAL, create nothing, and log one clear line saying why."""
    _, m = bucket_mount
    before = m.log()
    result = subprocess.run(["touch", str(work.path / name)], capture_output=True, timeout=60)
    assert result.returncode != 0 and b"Invalid argument" in result.stderr, \
        f"touch {name!r} exited {result.returncode}: {result.stderr!r}"
    assert os.listdir(work.path) == [], "the name shows in the mount"
    created = [o.name for o in emu.store.list_objects(work.bucket, prefix=work.prefix).objects if o.name != work.prefix]
    assert created == [], "an object was created"
    # Whatever a request logs is written before its answer: touch has had every answer.
    lines = _new_log(m, before)
    clear = [line for line in _levels(lines, "INFO", "WARNING", "ERROR") if _REASON.search(line)]
    assert len(clear) == 1, ("expected one log line saying CR/LF is refused in names; got:\n"
                             + "\n".join(_levels(lines, "INFO", "WARNING", "ERROR", "CRITICAL")))
    assert "Traceback" not in "\n".join(lines)


# ---------------------------------------------------------------- 5. modes with --preserve-mode

SCRIPT = b"#!/bin/sh\necho ran\n"


def _runs(path: pathlib.Path) -> str:
    try:
        result = subprocess.run([str(path)], capture_output=True, timeout=60)
    except OSError as err:
        return errno_name(err.errno)
    return "ran" if result.stdout == b"ran\n" else f"exit {result.returncode}: {result.stdout!r}"


def test_chmod_is_kept_with_preserve_mode(emu, work):
    """Regression: executables lose their mode (``python -m venv`` gives ``bin/pip``
    0644, EACCES). With ``--preserve-mode`` a chmod is stored in the object's
    metadata ``mode`` (an octal st_mode, as rclone) and shown by a fresh mount."""
    with _mount(emu, work.bucket, "--preserve-mode") as m:
        path = m.path / work.rel / "script.sh"
        path.write_bytes(SCRIPT)
        os.chmod(path, 0o755)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
        assert _runs(path) == "ran"
    info = emu.object_info(work.bucket, work.obj("script.sh"))
    assert info["metadata"].get(MODE_KEY) == "100755", info["metadata"]
    assert emu.read_object(work.bucket, work.obj("script.sh")) == SCRIPT
    with _mount(emu, work.bucket, "--preserve-mode") as fresh:
        path = fresh.path / work.rel / "script.sh"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755, oct(os.stat(path).st_mode)
        assert _runs(path) == "ran"


def test_chmod_changes_nothing_without_preserve_mode(emu, work):
    """The documented default (as gcsfuse): chmod succeeds and changes nothing."""
    path = work.path / "script.sh"
    path.write_bytes(SCRIPT)
    os.chmod(path, 0o755)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert MODE_KEY not in emu.object_info(work.bucket, work.obj("script.sh"))["metadata"]
    assert _runs(path) == "EACCES"
    with _mount(emu, work.bucket) as fresh:
        assert stat.S_IMODE(os.stat(fresh.path / work.rel / "script.sh").st_mode) == 0o644


def test_mode_metadata_from_another_client_is_honoured_with_preserve_mode(emu, work):
    """An object the official client wrote with metadata mode "100755" shows
    0755 and runs under ``--preserve-mode``; without the flag it is 0644."""
    official_write(emu.endpoint, work.bucket, work.obj("tool"), SCRIPT, metadata={MODE_KEY: "100755"})
    assert emu.object_info(work.bucket, work.obj("tool"))["metadata"][MODE_KEY] == "100755"
    assert stat.S_IMODE(os.stat(work.path / "tool").st_mode) == 0o644, "without the flag"
    with _mount(emu, work.bucket, "--preserve-mode") as m:
        path = m.path / work.rel / "tool"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755, oct(os.stat(path).st_mode)
        assert _runs(path) == "ran"


# ---------------------------------------------------------------- names made elsewhere after an ls

NEGATIVE_TTL = 2.0
NEW_NAME_KINDS = {"zonal": BUCKET, "hns": HNS, "flat": FLAT}


@pytest.fixture(scope="module", params=list(NEW_NAME_KINDS), ids=list(NEW_NAME_KINDS))
def fresh_names_mount(request, emu):
    bucket = NEW_NAME_KINDS[request.param]
    with _mount(emu, bucket, "--negative-ttl", str(NEGATIVE_TTL), "--retry-deadline", "20") as m:
        yield bucket, m


@pytest.mark.parametrize("what", ["file", "dir"])
def test_a_name_made_elsewhere_after_ls_shows_within_the_negative_ttl(emu, fresh_names_mount, request, what):
    """A listing is trusted for the names it holds, and its silence only for
    --negative-ttl: a producer's ``_SUCCESS`` or next shard, made after the
    consumer's ``ls``, shows that fast, not after the listing TTL (60 s)."""
    bucket, m = fresh_names_mount
    work = _workdir(emu, bucket, m.path, request)
    emu.seed(bucket, work.obj("present"), b"here")
    assert os.listdir(work.path) == ["present"]
    target = work.path / "new"
    assert_errno(lambda: os.stat(target), errno.ENOENT, "before the other client")
    if what == "file":
        official_write(emu.endpoint, bucket, work.obj("new"), b"made elsewhere")
    else:
        official_make_dir(emu.endpoint, bucket, work.obj("new/"))
    made = time.monotonic()
    deadline = made + NEGATIVE_TTL + 1.0
    while errno_of(lambda: os.stat(target)) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    took = time.monotonic() - made
    assert errno_of(lambda: os.stat(target)) is None, \
        f"{what} made elsewhere still ENOENT {took:.1f}s later (--negative-ttl {NEGATIVE_TTL})"
    assert stat.S_ISDIR(os.stat(target).st_mode) == (what == "dir")
    if what == "file":
        assert target.read_bytes() == b"made elsewhere"


def test_ls_l_after_a_listing_makes_no_request(emu, fresh_names_mount, request):
    """The names a listing holds keep its TTL: stat of each costs nothing."""
    bucket, m = fresh_names_mount
    work = _workdir(emu, bucket, m.path, request)
    emu.seed_many(bucket, {work.obj(f"f{i:02}"): b"x" * i for i in range(20)})
    names = sorted(os.listdir(work.path))
    assert len(names) == 20
    emu.reset_rpc_counts()
    sizes = [os.stat(work.path / name).st_size for name in names]
    assert sizes == list(range(20))
    assert emu.rpc_counts == {}, f"ls -l made requests: {emu.rpc_counts}"
