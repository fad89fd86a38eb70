"""Shell redirection and duplicated descriptors make exactly the uploads they need.

Many programs ignore errors from close, so a needless second upload that
fails would lose data silently. ``>>`` makes one append on an appendable
object, and a flush with nothing new since the last upload (a duplicated
descriptor closing) uploads nothing. Counted in the emulator's calls.
"""

from __future__ import annotations

import subprocess

from tests.mount.test_write import (  # noqa: F401 (fixtures)
    BUCKET, FLAT, _hang_guard, emu, mount_per_bucket)

UPLOADS = ("WriteObject", "BidiWriteObject")


bucket_mount, work = mount_per_bucket([BUCKET, FLAT])


def _sh(script: str) -> None:
    result = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr


def _uploads(emu) -> int:
    counts = emu.rpc_counts
    return sum(counts.get(name, 0) for name in UPLOADS)


def test_append_redirection_is_one_append(emu, work):
    path = work.path / "log"
    _sh(f"echo first > '{path}'")
    generation = emu.object_info(work.bucket, work.obj("log"))["generation"]
    emu.reset_rpc_counts()
    _sh(f"echo second >> '{path}'")
    assert emu.read_object(work.bucket, work.obj("log")) == b"first\nsecond\n"
    assert _uploads(emu) == 1, f"one append stream or one upload: {emu.rpc_counts}"
    if work.bucket == BUCKET:  # an appendable object: the append keeps the generation
        assert emu.object_info(work.bucket, work.obj("log"))["generation"] == generation


def test_duplicated_descriptors_upload_nothing_twice(emu, work):
    path = work.path / "dup"
    emu.reset_rpc_counts()
    # bash: open with O_TRUNC, dup2, close the first, write through the copy, close it.
    _sh(f"exec 3>'{path}'; echo a >&3; exec 4>&3; exec 3>&-; echo b >&4; exec 4>&-")
    assert emu.read_object(work.bucket, work.obj("dup")) == b"a\nb\n"
    uploads = _uploads(emu)
    assert uploads <= 2, f"a flush with nothing new must upload nothing: {emu.rpc_counts}"
    emu.reset_rpc_counts()
    _sh(f"exec 3>>'{path}'; exec 4>&3; exec 3>&-; exec 4>&-")  # opened and closed, nothing written
    assert _uploads(emu) == 0, f"nothing written, nothing uploaded: {emu.rpc_counts}"
    assert emu.read_object(work.bucket, work.obj("dup")) == b"a\nb\n"
