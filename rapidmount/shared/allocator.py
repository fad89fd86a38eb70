"""Keep glibc from returning chunk-sized buffers to the kernel.

Every 2 MiB read chunk is a fresh ``bytes`` (and grpc and protobuf make
more). With glibc's defaults such buffers are mmapped and unmapped, or
trimmed off the heap top, so each one costs ~512 first-touch page faults;
on this kind of VM that caps a stream at ~250 MB/s. Raising the mmap and
trim thresholds keeps freed buffers in the heap for reuse (measured: ~3.5x
the read throughput). Process-wide, so only whole processes call it: the
mount daemon, its data-plane workers and the emulator's command line, never
a library user.

Kept free memory also piles up in fragments over hours of mixed traffic
(measured: +10-15% RSS in three minutes of 64 busy handles), so the mount's
processes call :func:`release_free_memory` every ``TRIM_INTERVAL_S``.

That trim cannot reach the arenas glibc gives other threads: it returns
their free chunks but never the free top of their heaps, and with the trim
threshold raised, free() never shrinks them either. In a worker, gRPC's
threads allocate what the sockets receive, so each of their arenas kept its
highest mark for good (measured over an hour of 64 busy handles: four or
five arenas per worker, almost all free, growing to 150-170 MiB a worker and
still growing). :func:`share_one_arena` puts every thread on the main arena,
which the trim reaches whole. Free fragments smaller than a page stay; under
hours of heavy traffic the workers stay within a few percent (docs/reliability.md,
R4; what grew for hours was a leak in gRPC's core, which the read streams'
close now avoids).

The workers can also run on jemalloc (``--worker-allocator``,
:func:`worker_environment`): it keeps sizes apart and gives idle pages back
on its own, for about 15% more worker CPU on sequential reads. Everything
above is then skipped in them (:func:`jemalloc_is_malloc`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Mapping

logger = logging.getLogger("rapidmount")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD = 32 * 1024 * 1024    # glibc's maximum on 64-bit
_TRIM_THRESHOLD = 512 * 1024 * 1024   # free heap kept before trimming
#: How often the mount's processes give free pages back; each time costs at
#: most a few thousand page faults later, against unbounded fragmentation.
TRIM_INTERVAL_S = 30.0
_KEEP_AT_TOP = 8 * 1024 * 1024  # left at the heap's top for the next chunks


@functools.cache  # find_library runs ldconfig: once per process, not at every trim
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def release_free_memory() -> bool:
    """Return the whole free pages malloc holds, in every arena, to the kernel
    (glibc's ``malloc_trim``); False where that is not possible."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:  # not glibc
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    trim(_KEEP_AT_TOP)
    return True


def _mallopt(option: int, value: int) -> bool:
    """glibc's ``mallopt``; False where it is missing (not glibc) or refuses."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(option, value))


def retain_large_buffers() -> bool:
    """Tune glibc malloc; False (and no change) where that is not possible."""
    tuned = _mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and _mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    if not tuned:
        logger.info("could not tune malloc thresholds; reads will be slower")
    return tuned


def share_one_arena() -> bool:
    """Make every thread of this process allocate from glibc's main arena, so
    :func:`release_free_memory` reaches all its free memory. Call it before
    the process starts threads: a thread that allocated already keeps its
    arena. False (and no change) where that is not possible."""
    return _mallopt(_M_ARENA_MAX, 1)


#: The shared library's name, as ``LD_PRELOAD`` finds it (Debian's ``libjemalloc2``).
JEMALLOC = "libjemalloc.so.2"
#: jemalloc's settings in a worker, unless the environment gives ``MALLOC_CONF``:
#: a thread returns idle pages after 2 s (so a quiet worker shrinks) and two
#: arenas are plenty for a worker's handful of threads.
WORKER_MALLOC_CONF = "background_thread:true,narenas:2,dirty_decay_ms:2000,muzzy_decay_ms:0"
ALLOCATORS = ("auto", "jemalloc", "glibc")


def jemalloc_installed() -> bool:
    """Whether the dynamic linker can find jemalloc (``ldconfig``'s cache)."""
    return ctypes.util.find_library("jemalloc") is not None


def resolve_worker_allocator(choice: str) -> str:
    """``jemalloc`` or ``glibc`` for ``--worker-allocator``; ValueError when
    jemalloc is asked for and missing."""
    if choice == "glibc":
        return "glibc"
    if jemalloc_installed():
        return "jemalloc"
    if choice == "jemalloc":
        raise ValueError(f"{JEMALLOC} is not installed (Debian and Ubuntu: apt install libjemalloc2)")
    return "glibc"


def worker_environment(allocator: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment a worker starts with: ``environ``, plus jemalloc
    preloaded when ``allocator`` is ``jemalloc``."""
    env = dict(environ)
    if allocator == "jemalloc":
        env["LD_PRELOAD"] = " ".join(filter(None, (JEMALLOC, environ.get("LD_PRELOAD"))))
        env.setdefault("MALLOC_CONF", WORKER_MALLOC_CONF)
    return env


def jemalloc_is_malloc() -> bool:
    """Whether this process's malloc is jemalloc's (preloaded): glibc's tuning
    and trims would only touch an allocator nobody uses."""
    try:
        return hasattr(ctypes.CDLL(None), "mallctl")
    except OSError:
        return False
