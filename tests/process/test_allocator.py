"""glibc malloc tuning of the mount's processes (rapidmount/shared/allocator.py).

Each case runs in a fresh interpreter: the settings are process-wide and must
come before the process starts threads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rapidmount.shared import allocator

pytestmark = pytest.mark.skipif(allocator._libc() is None or not hasattr(allocator._libc(), "malloc_info"),
                                reason="glibc only")

# Threads that each hold 8 MiB of buffers at once, then free them, as gRPC's
# threads do with what the sockets receive; then the heaps malloc_info lists.
_THREADS_THEN_HEAPS = textwrap.dedent("""
    import ctypes, os, re, sys, tempfile, threading
    from rapidmount.shared import allocator
    {setup}
    allocator.retain_large_buffers()

    def churn():
        for _ in range(20):
            buffers = [bytearray(1 << 20) for _ in range(8)]
            del buffers

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    allocator.release_free_memory()
    libc = allocator._libc()
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        info = open(out.name).read()
    used = [int(size) for size in re.findall(r'<heap nr="\\d+">.*?<system type="current" size="(\\d+)"/>', info, re.S)]
    print(sum(1 for size in used if size > 0))
""")


def _heaps_after_threads(setup: str) -> int:
    result = subprocess.run([sys.executable, "-c", _THREADS_THEN_HEAPS.format(setup=setup)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_threads_get_arenas_of_their_own_by_default():
    """The premise: without share_one_arena, the threads' buffers go to other
    arenas, whose free tops the periodic trim cannot return."""
    assert _heaps_after_threads("") > 1


def test_one_arena_keeps_every_thread_on_the_main_arena():
    """The R4 hour-long run grew by 150-170 MiB a worker of free memory held
    in gRPC threads' arenas; with one arena the trim reaches all of it."""
    assert _heaps_after_threads("assert allocator.share_one_arena()") == 1


# -- the workers' allocator (--worker-allocator) --------------------------------------------------


def test_auto_prefers_jemalloc_when_installed_and_falls_back_to_glibc(monkeypatch):
    monkeypatch.setattr(allocator, "jemalloc_installed", lambda: True)
    assert allocator.resolve_worker_allocator("auto") == "jemalloc"
    assert allocator.resolve_worker_allocator("glibc") == "glibc"
    monkeypatch.setattr(allocator, "jemalloc_installed", lambda: False)
    assert allocator.resolve_worker_allocator("auto") == "glibc"
    with pytest.raises(ValueError, match="libjemalloc2"):
        allocator.resolve_worker_allocator("jemalloc")


def test_a_worker_environment_preloads_jemalloc_and_keeps_the_users_settings():
    env = allocator.worker_environment("jemalloc", {"PATH": "/bin", "LD_PRELOAD": "libmine.so"})
    assert env["LD_PRELOAD"] == f"{allocator.JEMALLOC} libmine.so"
    assert env["MALLOC_CONF"] == allocator.WORKER_MALLOC_CONF
    assert env["PATH"] == "/bin"
    mine = allocator.worker_environment("jemalloc", {"MALLOC_CONF": "narenas:1"})
    assert mine["MALLOC_CONF"] == "narenas:1" and mine["LD_PRELOAD"] == allocator.JEMALLOC
    assert allocator.worker_environment("glibc", {"PATH": "/bin"}) == {"PATH": "/bin"}


def test_a_process_knows_which_malloc_it_runs_on():
    if not allocator.jemalloc_installed():  # make system-deps installs it
        if os.environ.get("CI"):
            pytest.fail("libjemalloc2 is not installed under CI")
        pytest.skip("libjemalloc2 is not installed")
    probe = [sys.executable, "-c", "from rapidmount.shared import allocator; print(allocator.jemalloc_is_malloc())"]
    glibc = subprocess.run(probe, capture_output=True, text=True, timeout=60,
                           env=allocator.worker_environment("glibc"))
    jemalloc = subprocess.run(probe, capture_output=True, text=True, timeout=60,
                              env=allocator.worker_environment("jemalloc"))
    assert (glibc.stdout.strip(), jemalloc.stdout.strip()) == ("False", "True"), (glibc.stderr, jemalloc.stderr)
