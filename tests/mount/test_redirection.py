"""Shell redirection and duplicated descriptors make exactly the uploads they need.

Many programs ignore errors from close, so a needless second upload that
fails would lose data silently. bash's ``echo x > existing`` opens the file
with ``O_TRUNC``, dup2s it and closes the first descriptor (a flush) before it
writes: that flush must not upload the emptied file, or the command makes two
generations, and a refused second one leaves the object empty while the
shell exits 0. ``>>`` makes one append on an appendable object, and a flush
with nothing new since the last upload (a duplicated descriptor closing)
uploads nothing. Counted in the emulator's calls, on a zonal and a flat
bucket.
"""

from __future__ import annotations

import subprocess

from tests.mount.test_write import (  # noqa: F401 (fixtures)
    BUCKET, FLAT, _hang_guard, emu, mount_per_bucket)
from tests.mountutil import after_release

UPLOADS = ("WriteObject", "BidiWriteObject")


bucket_mount, work = mount_per_bucket([BUCKET, FLAT])


def _sh(script: str) -> None:
    result = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr


def _uploads(emu) -> int:
    counts = emu.rpc_counts
    return sum(counts.get(name, 0) for name in UPLOADS)


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
    assert _uploads(emu) == 1, f"one new generation, not an empty one first: {emu.rpc_counts}"
    info = emu.object_info(work.bucket, work.obj("f"))
    assert info["generation"] != generation and info["size"] == 2


def test_a_truncation_alone_is_one_generation(emu, work):
    path = work.path / "f"
    _existing(emu, work, "f", b"old contents\n")
    emu.reset_rpc_counts()
    _sh(f": > '{path}'")  # open with O_TRUNC, close: uploaded at the release
    _settled(emu, work, "f", b"")
    assert _uploads(emu) == 1, f"{emu.rpc_counts}"


def test_append_redirection_is_one_append(emu, work):
    path = work.path / "log"
    _sh(f"echo first > '{path}'")
    generation = emu.object_info(work.bucket, work.obj("log"))["generation"]
    emu.reset_rpc_counts()
    _sh(f"echo second >> '{path}'")
    _settled(emu, work, "log", b"first\nsecond\n")
    assert _uploads(emu) == 1, f"one append stream or one upload: {emu.rpc_counts}"
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
    assert _uploads(emu) == expected, f"a flush with nothing new must upload nothing: {emu.rpc_counts}"
    emu.reset_rpc_counts()
    _sh(f"exec 3>>'{path}'; exec 4>&3; exec 3>&-; exec 4>&-")  # opened and closed, nothing written
    assert (work.path / "dup").read_bytes() == b"a\nb\n"
    assert _uploads(emu) == 0, f"nothing written, nothing uploaded: {emu.rpc_counts}"
    assert emu.read_object(work.bucket, work.obj("dup")) == b"a\nb\n"


def test_exec_over_an_existing_file_uploads_only_what_each_close_adds(emu, work):
    path = work.path / "f"
    _existing(emu, work, "f", b"old contents\n")
    emu.reset_rpc_counts()
    # The O_TRUNC, then bytes before each close: each close has something new.
    _sh(f"exec 3>'{path}'; echo a >&3; exec 4>&3; exec 3>&-; echo b >&4; exec 4>&-")
    _settled(emu, work, "f", b"a\nb\n")
    assert _uploads(emu) == 2, f"{emu.rpc_counts}"
    emu.reset_rpc_counts()
    # The first close comes before any write: only the second one uploads.
    _sh(f"exec 3>'{path}'; exec 4>&3; exec 3>&-; echo c >&4; exec 4>&-")
    _settled(emu, work, "f", b"c\n")
    assert _uploads(emu) == 1, f"{emu.rpc_counts}"
