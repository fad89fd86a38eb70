"""Bytes of another process, read with process_vm_readv: what a worker reads
of its parent, the probe that decides whether it may, and runs of bytes
sliced without reading them."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from rapidmount.shared import peer_memory
from rapidmount.shared.peer_memory import PeerBytes, PeerReadError, address_of, probe, read_into


def _in_a_child(body) -> str:
    """``body()`` in a forked child (the parent is this process); what it returned, as text."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reading)
            os.write(writing, repr(body()).encode())
        finally:
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer


def test_a_child_reads_its_parents_bytes_and_the_probe_says_it_may():
    token = os.urandom(32)
    written = [os.urandom(70_000), os.urandom(5), os.urandom(131_072)]
    segments = [(address_of(data), len(data)) for data in written]

    def child():
        copy = ctypes.create_string_buffer(sum(map(len, written)))
        read_into(os.getppid(), segments, ctypes.addressof(copy))
        return probe(os.getppid(), address_of(token), token), copy.raw == b"".join(written)

    assert _in_a_child(child) == repr((None, True))


def test_the_probe_says_why_reads_do_not_work(monkeypatch):
    token = os.urandom(16)
    other = os.urandom(16)
    assert probe(os.getpid(), address_of(token), token) is None
    assert probe(os.getpid(), address_of(other), token) == "process_vm_readv read other bytes than the mount's"
    assert probe(os.getpid(), 4096, token).startswith("process_vm_readv: EFAULT")
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    assert probe(gone, address_of(token), token).startswith("process_vm_readv: ESRCH")
    monkeypatch.setenv(peer_memory.DISABLE_ENV, "1")
    assert probe(os.getpid(), address_of(token), token) == f"turned off by {peer_memory.DISABLE_ENV}"


def test_the_probe_is_refused_across_users():
    """EPERM, as under a stricter Yama scope or for a parent that is not dumpable."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("needs root under CI, to become another user")
        pytest.skip("needs root to become another user")
    token = os.urandom(16)

    def child():
        os.setgid(65534)
        os.setuid(65534)
        return probe(os.getppid(), address_of(token), token)

    assert _in_a_child(child).startswith("'process_vm_readv: EPERM")


def test_a_short_read_is_an_error_never_bytes_left_unwritten():
    kept = os.urandom(9000)
    copy = ctypes.create_string_buffer(9100)
    with pytest.raises(PeerReadError) as caught:
        read_into(os.getpid(), [(address_of(kept), len(kept)), (4096, 100)], ctypes.addressof(copy))
    assert caught.value.errno == errno.EFAULT


def test_more_segments_than_one_call_takes():
    pieces = [bytes([i % 251]) * 3 for i in range(2500)]
    copy = ctypes.create_string_buffer(3 * len(pieces))
    assert read_into(os.getpid(), [(address_of(p), len(p)) for p in pieces], ctypes.addressof(copy)) == len(copy)
    assert copy.raw == b"".join(pieces)


def test_runs_slice_without_reading_and_read_exactly():
    first, second = os.urandom(1000), os.urandom(3000)
    run = PeerBytes(os.getpid(), [(address_of(first), len(first)), (address_of(second), len(second))])
    whole = first + second
    assert len(run) == 4000 and run.read() == whole
    for start, stop in ((0, 4000), (0, 1000), (999, 1001), (1000, 4000), (2500, 2600), (3999, 4000), (4000, 4000)):
        part = run[start:stop]
        assert len(part) == stop - start and part.read() == whole[start:stop]
    assert run[1500:].segments == ((address_of(second) + 500, 2500),)
    with pytest.raises(ValueError):
        run[::2]


def test_the_ptrace_exception_is_made_only_under_yamas_relational_scope(monkeypatch):
    calls = []
    libc = type("Libc", (), {"prctl": staticmethod(lambda *args: calls.append(args) or 0)})
    monkeypatch.setattr(peer_memory, "_libc", libc)
    for scope, made in ((None, False), (0, False), (1, True), (2, False), (3, False)):
        calls.clear()
        monkeypatch.setattr(peer_memory, "yama_scope", lambda scope=scope: scope)
        assert peer_memory.let_descendants_read() is None
        assert calls == ([(peer_memory._PR_SET_PTRACER, os.getpid(), 0, 0, 0)] if made else [])
