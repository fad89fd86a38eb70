"""Shell redirection and duplicated descriptors: each close that returns 0
has put its change in the bucket, and no upload is made that is not needed.

Many programs ignore errors from close, so a needless upload that fails
would lose data silently. bash's ``echo x > existing`` opens the file with
``O_TRUNC``, dup2s it and closes the first descriptor (a flush) before it
writes: that close uploads the emptied file (another client reads it empty
once close returned). On the zonal bucket the write then streams into that
same generation, so the command makes one upload; on the flat bucket it
makes two. ``>>`` makes one append on an appendable object, and a flush with
nothing new since the last upload (a duplicated descriptor closing) uploads
nothing. Counted in the emulator's calls, on a zonal and a flat bucket.
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from tests.conftest import report_line
from tests.mount.test_write import (  # noqa: F401 (fixtures)
    BUCKET, FLAT, _hang_guard, _mount, _workdir, emu, mount_per_bucket, official_read)
from tests.mountutil import after_release, errno_of

UPLOADS = ("WriteObject", "BidiWriteObject")
#: (what, bucket, uploads needed, uploads counted), for R10's summary line.
_COUNTED: list[tuple[str, str, int, int]] = []


bucket_mount, work = mount_per_bucket([BUCKET, FLAT])


@pytest.fixture(scope="module", autouse=True)
def r10_summary():
    yield
    if not _COUNTED:
        return
    needed = sum(row[2] for row in _COUNTED)
    counted = sum(row[3] for row in _COUNTED)
    needless = sum(max(0, row[3] - row[2]) for row in _COUNTED)
    missing = sum(max(0, row[2] - row[3]) for row in _COUNTED)
    kind = {BUCKET: "zonal", FLAT: "flat"}
    per_line: dict[str, list[str]] = {}
    for what, bucket, _, uploads in _COUNTED:
        per_line.setdefault(what, []).append(f"{kind[bucket]} {uploads}")
    lines = "; ".join(f"`{what}` {', '.join(uploads)}" for what, uploads in per_line.items())
    report_line("R10", f"shell redirection: {len(_COUNTED)} command lines, {counted} uploads counted in the "
                       f"emulator's calls where {needed} were needed ({lines}); {needless} needless, {missing} missing")


def _sh(script: str) -> None:
    result = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr


def _uploads(emu) -> int:
    counts = emu.rpc_counts
    return sum(counts.get(name, 0) for name in UPLOADS)


def _expect_uploads(emu, work, what: str, needed: int) -> None:
    """The emulator counted exactly the ``needed`` uploads since its counts were reset."""
    counted = _uploads(emu)
    _COUNTED.append((what, work.bucket, needed, counted))
    assert counted == needed, f"{what}: {needed} upload(s) needed, {counted} made: {emu.rpc_counts}"


def _existing(emu, work, name: str, data: bytes) -> int:
    """An object as this mount leaves them: unfinalized (appendable) on the zonal bucket."""
    return emu.seed(work.bucket, work.obj(name), data, finalize=work.bucket != BUCKET)


def _settled(emu, work, name: str, expected: bytes) -> None:
    """Wait until the bucket holds ``expected``: the kernel sends the last
    release after the shell exited, and a truncation alone is uploaded there.
    Reading through the mount then also waits for that release."""
    assert after_release(lambda: emu.read_object(work.bucket, work.obj(name)) == expected)
    assert (work.path / name).read_bytes() == expected


def test_echo_over_an_existing_file_is_one_generation(emu, work):
    path = work.path / "f"
    generation = _existing(emu, work, "f", b"old contents\n")
    emu.reset_rpc_counts()
    _sh(f"echo x > '{path}'")
    _settled(emu, work, "f", b"x\n")
    # The close before the write uploads the emptied file; on the zonal bucket
    # the write streams into that generation, on the flat one it is another.
    _expect_uploads(emu, work, "echo x > existing", 1 if work.bucket == BUCKET else 2)
    info = emu.object_info(work.bucket, work.obj("f"))
    assert info["generation"] != generation and info["size"] == 2


def test_a_truncation_alone_is_one_generation(emu, work):
    path = work.path / "f"
    _existing(emu, work, "f", b"old contents\n")
    emu.reset_rpc_counts()
    _sh(f": > '{path}'")  # open with O_TRUNC, close: uploaded by the close
    _settled(emu, work, "f", b"")
    _expect_uploads(emu, work, ": > existing", 1)


def test_append_redirection_is_one_append(emu, work):
    path = work.path / "log"
    _sh(f"echo first > '{path}'")
    generation = emu.object_info(work.bucket, work.obj("log"))["generation"]
    emu.reset_rpc_counts()
    _sh(f"echo second >> '{path}'")
    _settled(emu, work, "log", b"first\nsecond\n")
    _expect_uploads(emu, work, "echo >> log", 1)  # one append stream, or one upload
    if work.bucket == BUCKET:  # an appendable object: the append keeps the generation
        assert emu.object_info(work.bucket, work.obj("log"))["generation"] == generation


def test_duplicated_descriptors_upload_nothing_twice(emu, work):
    path = work.path / "dup"
    emu.reset_rpc_counts()
    # bash: open with O_TRUNC, dup2, close the first, write through the copy, close it.
    _sh(f"exec 3>'{path}'; echo a >&3; exec 4>&3; exec 3>&-; echo b >&4; exec 4>&-")
    _settled(emu, work, "dup", b"a\nb\n")
    # A new file: on the zonal bucket created at open, and both writes stream
    # into it; on the flat bucket each close after a write uploads the file.
    expected = 1 if work.bucket == BUCKET else 2
    _expect_uploads(emu, work, "exec 3>new, dup, write, close", expected)  # a flush with nothing new: nothing
    emu.reset_rpc_counts()
    _sh(f"exec 3>>'{path}'; exec 4>&3; exec 3>&-; exec 4>&-")  # opened and closed, nothing written
    assert (work.path / "dup").read_bytes() == b"a\nb\n"
    _expect_uploads(emu, work, "exec 3>>f, dup, close, nothing written", 0)
    assert emu.read_object(work.bucket, work.obj("dup")) == b"a\nb\n"


def test_exec_over_an_existing_file_uploads_only_what_each_close_adds(emu, work):
    path = work.path / "f"
    _existing(emu, work, "f", b"old contents\n")
    emu.reset_rpc_counts()
    # The O_TRUNC, then bytes before each close: each close has something new.
    _sh(f"exec 3>'{path}'; echo a >&3; exec 4>&3; exec 3>&-; echo b >&4; exec 4>&-")
    _settled(emu, work, "f", b"a\nb\n")
    _expect_uploads(emu, work, "exec 3>existing, write, dup, close, write, close", 2)
    emu.reset_rpc_counts()
    # The first close comes before any write: it uploads the truncation; on
    # the zonal bucket the write streams into that generation.
    _sh(f"exec 3>'{path}'; exec 4>&3; exec 3>&-; echo c >&4; exec 4>&-")
    _settled(emu, work, "f", b"c\n")
    _expect_uploads(emu, work, "exec 3>existing, dup, close, write, close", 1 if work.bucket == BUCKET else 2)


# ---------------------------------------------------------------- close-to-open: the other client reads it

def _theirs(emu, work, name: str) -> bytes:
    """The object as another client reads it: Google's official client on the
    zonal bucket, the emulator's own read on the flat one."""
    if work.bucket == BUCKET:
        return official_read(emu.endpoint, work.bucket, work.obj(name))
    return emu.read_object(work.bucket, work.obj(name))


@pytest.mark.parametrize("how", ["truncate -s", ": >", "O_TRUNC and close", "dup, close, write, close"])
def test_the_other_client_reads_the_change_once_close_returned(emu, work, how):
    path = work.path / "f"
    _existing(emu, work, "f", b"0123456789")
    if how == "truncate -s":
        _sh(f"truncate -s 4 '{path}'")
        assert _theirs(emu, work, "f") == b"0123"
        _sh(f"truncate -s 6 '{path}'")
        assert _theirs(emu, work, "f") == b"0123\0\0"
    elif how == ": >":
        _sh(f": > '{path}'")
        assert _theirs(emu, work, "f") == b""
    elif how == "O_TRUNC and close":
        os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
        assert _theirs(emu, work, "f") == b""
    else:
        first = os.open(path, os.O_WRONLY | os.O_TRUNC)
        second = os.dup(first)
        os.close(first)
        assert _theirs(emu, work, "f") == b"", "the other descriptor is still open"
        os.write(second, b"c\n")
        os.close(second)
        assert _theirs(emu, work, "f") == b"c\n"
    assert (work.path / "f").read_bytes() == _theirs(emu, work, "f")


@pytest.mark.parametrize("how", ["O_TRUNC", "ftruncate"])
def test_a_truncation_refused_at_close_is_an_error_and_theirs_stays(emu, work, how):
    """The object replaced by another client between the truncation and the
    close: the close says ESTALE, and not a byte of theirs changes."""
    path = work.path / "f"
    _existing(emu, work, "f", b"mine, soon empty")
    fd = os.open(path, os.O_WRONLY | (os.O_TRUNC if how == "O_TRUNC" else 0))
    if how == "ftruncate":
        os.ftruncate(fd, 0)
    emu.seed(work.bucket, work.obj("f"), b"theirs")
    assert errno_of(lambda: os.close(fd)) == errno.ESTALE
    assert emu.read_object(work.bucket, work.obj("f")) == b"theirs"
    # Once the kernel released the file, the mount shows theirs, and the
    # release uploaded nothing.
    assert after_release(lambda: (work.path / "f").read_bytes() == b"theirs")
    assert emu.read_object(work.bucket, work.obj("f")) == b"theirs"


def test_a_truncation_whose_upload_keeps_failing_is_eio_at_close(emu, request):
    """Every upload refused by the service until --retry-deadline: the close
    says EIO (it does not return 0 with the bucket unchanged)."""
    with _mount(emu, BUCKET, "--retry-deadline", "2") as m:
        work = _workdir(emu, BUCKET, m.path, request)
        _existing(emu, work, "f", b"old contents")
        fd = os.open(work.path / "f", os.O_WRONLY | os.O_TRUNC)
        emu.add_fault("outage:method=BidiWriteObject")
        try:
            assert errno_of(lambda: os.close(fd)) == errno.EIO
        finally:
            emu.clear_faults()
        assert emu.read_object(BUCKET, work.obj("f")) == b"old contents"
