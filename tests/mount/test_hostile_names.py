"""Hostile object names, written with Google's official client, through a real mount.

``RAPIDMOUNT_HOSTILE_NAMES`` names (2,000 by default; 10,000 for a soak run)
are created in a zonal bucket of the emulator with google-cloud-storage's
async gRPC client (``AsyncAppendableObjectWriter``, finalized on close), every
one of them: the catalogue of tests/hostilenames.py (``..``, ``.``, empty
segments, leading and trailing slashes, 1,024-byte names, control
characters, NUL, names colliding with directories, ``a/../../etc/passwd``,
backslashes, names longer than NAME_MAX, NFC/NFD twins, names that are not
UTF-8), then random mixes from a seeded generator. The names the service
refuses must be refused (the official client cannot even send a name that
is not UTF-8: a ``str`` holds one only as a lone surrogate; sent as raw
bytes, the emulator answers ``INVALID_ARGUMENT``, see
tests/emulator/test_rpc.py).

The mount is walked twice (the second walk from what the first cached; the
same after every listing expired is tests/core/test_hostile_names.py's, on a
fake clock), and:

* the daemon stays up and answers, with no internal error (crashes);
* every path, and its ``realpath``, stays below the mountpoint (escapes),
  and ``readdir`` never returns ``.`` or ``..`` but once each, nor a name
  holding ``/`` or NUL;
* every name is either shown, reading it gives its object's bytes, or
  hidden, and the daemon logs one line naming it, never two: the name, or
  the prefix up to the segment that hides everything below it (``a/../``).

One line of figures is printed: tried, refused, shown, hidden, crashes,
escapes and seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import os
import stat
import time

import pytest
from google.api_core import exceptions

from rapidmount.emulator import Emulator
from tests.conftest import make_official_client
from tests.hostilenames import content, expected_view, hostile_names, names_it, refusal
from tests.mountutil import HangGuard

BUCKET = "hostile"
COUNT = int(os.environ.get("RAPIDMOUNT_HOSTILE_NAMES", "2000"))
WRITERS = 16  # objects written at once

guard = HangGuard(limit=120.0 + COUNT * 0.02)
hang_guard = guard.autouse_fixture()


# -- the bucket ----------------------------------------------------------------------------------

async def _write_all(endpoint: str, names: list[str]) -> dict[str, str]:
    """Write every name with the official client; returns the refused ones and why."""
    from google.cloud.storage.asyncio.async_appendable_object_writer import AsyncAppendableObjectWriter

    client = make_official_client(endpoint)
    slots = asyncio.Semaphore(WRITERS)
    refused: dict[str, str] = {}

    async def write(index: int, name: str) -> None:
        async with slots:
            writer = AsyncAppendableObjectWriter(client, BUCKET, name)
            try:
                await writer.open()
                await writer.append(content(index, name))
                await writer.close(finalize_on_close=True)
            except exceptions.InvalidArgument as err:
                refused[name] = f"InvalidArgument: {err.message}"
                # The client leaves the refused stream open: close it, or the
                # loop's shutdown complains about its pending tasks.
                stream = getattr(writer.write_obj_stream, "socket_like_rpc", None)
                if stream is not None:
                    with contextlib.suppress(Exception):
                        await stream.close()
            except UnicodeEncodeError as err:  # not UTF-8: the client cannot send it
                refused[name] = f"UnicodeEncodeError: {err.reason}"

    await asyncio.gather(*(write(index, name) for index, name in enumerate(names)))
    await client.grpc_client.transport.close()
    return refused


# -- reading directories as the kernel returns them ----------------------------------------------

class _Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64), ("d_reclen", ctypes.c_ushort),
                ("d_type", ctypes.c_ubyte), ("d_name", ctypes.c_char * 256)]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.opendir.restype = ctypes.c_void_p
_libc.opendir.argtypes = (ctypes.c_char_p,)
_libc.readdir64.restype = ctypes.POINTER(_Dirent)
_libc.readdir64.argtypes = (ctypes.c_void_p,)
_libc.closedir.argtypes = (ctypes.c_void_p,)


def raw_listdir(path: bytes) -> list[bytes]:
    """Every name readdir(3) returns, ``.`` and ``..`` included (os.listdir drops them)."""
    handle = _libc.opendir(path)
    if not handle:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    try:
        names = []
        while True:
            ctypes.set_errno(0)
            entry = _libc.readdir64(handle)
            if not entry:
                if ctypes.get_errno():
                    code = ctypes.get_errno()
                    raise OSError(code, os.strerror(code), path)
                return names
            names.append(entry.contents.d_name)
    finally:
        _libc.closedir(handle)


def walk(root: str, escapes: list[str]) -> tuple[dict[str, str], set[str]]:
    """Files and directories below ``root`` (paths relative to it, str): every
    directory read raw, every path checked to stay below the root."""
    root_bytes = os.fsencode(os.path.realpath(root))
    files: dict[str, str] = {}
    directories: set[str] = set()
    pending = [b""]
    while pending:
        relative = pending.pop()
        here = os.path.join(root_bytes, relative) if relative else root_bytes
        names = raw_listdir(here)
        if names.count(b".") != 1 or names.count(b"..") != 1:
            escapes.append(f"{here!r} lists . {names.count(b'.')} and .. {names.count(b'..')} times")
        for name in names:
            if name in (b".", b".."):
                continue
            if not name or b"/" in name:
                escapes.append(f"{here!r} lists {name!r}")
                continue
            child = relative + b"/" + name if relative else name
            path = os.path.join(root_bytes, child)
            real = os.path.realpath(path)
            if not real.startswith(root_bytes + b"/"):
                escapes.append(f"{path!r} resolves to {real!r}")
                continue
            mode = os.lstat(path).st_mode
            text = child.decode("utf-8")
            if stat.S_ISDIR(mode):
                directories.add(text)
                pending.append(child)
            elif stat.S_ISREG(mode):
                files[text] = path
            else:
                escapes.append(f"{path!r} is neither a file nor a directory (mode {mode:o})")
    return files, directories


# -- the check -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bucket():
    """The emulator, the names tried, the ones refused and the seconds writing took."""
    names = hostile_names(COUNT)
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        started = time.monotonic()
        refused = asyncio.run(_write_all(emulator.endpoint, names))
        yield emulator, names, refused, time.monotonic() - started


def test_refusals_are_the_services_rules(bucket):
    emulator, names, refused, _ = bucket
    expected = {name for name in names if refusal(name) is not None}
    assert set(refused) == expected, {name: refused.get(name, refusal(name))
                                      for name in set(refused) ^ expected}
    for name in refused:
        if refusal(name) != "not UTF-8":
            assert emulator.object_info(BUCKET, name) is None


def _wait_for(m, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line and " done in " in line for line in m.log().splitlines()):
        assert time.monotonic() < deadline, f"no {text!r} line in the log"
        time.sleep(0.05)


def _hiding_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if ": hiding " in line]


@pytest.mark.parametrize("flags", [(), ("--prefetch-metadata",)], ids=["on-demand", "prefetch"])
def test_every_name_is_shown_or_hidden_once(bucket, flags, report):
    emulator, names, refused, write_seconds = bucket
    accepted = [name for name in names if name not in refused]
    indexes = {name: index for index, name in enumerate(names)}
    view = expected_view(accepted)
    started = time.monotonic()
    escapes: list[str] = []
    wrong: list[str] = []
    with guard.mount(emulator, BUCKET, *flags) as m:
        root = str(m.path)
        if flags:
            _wait_for(m, "metadata prefetch of ")
        files, directories = walk(root, escapes)
        for relative, path in files.items():
            name = view.files.get(relative)
            if name is None:
                continue  # reported below
            with open(path, "rb") as file:
                if file.read() != content(indexes[name], name):
                    wrong.append(name)
        # Lookups of hidden names that are one component: refused, or not found.
        for relative in ("O" * 256, "long/" + "P" * 300, "é" * 128):
            with pytest.raises(OSError) as info:
                os.stat(os.path.join(root, relative))
            assert info.value.errno == errno.ENAMETOOLONG
        files_again, directories_again = walk(root, escapes)
        alive = m.process.poll() is None and stat.S_ISDIR(os.stat(root).st_mode)
        log = m.log()
    seconds = time.monotonic() - started

    crashes = (not alive) + log.count("internal error in ") + log.count("Traceback")
    lines = _hiding_lines(log)
    logged = {key: sum(1 for line in lines if names_it(line, key)) for key in view.hidden}
    shown, hidden = view.shown_objects, view.hidden_objects
    report("R5", f"hostile names{' with ' + ' '.join(flags) if flags else ''}: tried {len(names)}, "
          f"refused {len(refused)}, shown {len(shown)} ({len(view.files)} files, {len(view.placeholders)} "
          f"placeholders of {len(view.directories)} directories), hidden {len(hidden)} ({len(lines)} log lines), "
          f"crashes {crashes}, escapes {len(escapes)}; {write_seconds:.1f} s writing, "
          f"{seconds:.1f} s through the mount")

    # Every name the service took is shown or hidden, never both.
    assert shown | hidden == set(accepted) and not shown & hidden
    assert crashes == 0, [line for line in log.splitlines() if "internal error" in line or "Traceback" in line]
    assert not escapes, escapes[:20]
    assert set(files) == set(view.files), {
        "not shown": sorted(set(view.files) - set(files))[:20],
        "shown, but not expected": sorted(set(files) - set(view.files))[:20]}
    assert directories == view.directories, {
        "not shown": sorted(view.directories - directories)[:20],
        "shown, but not expected": sorted(directories - view.directories)[:20]}
    assert (set(files_again), directories_again) == (set(files), directories)
    assert not wrong, wrong[:20]
    assert {key: count for key, count in logged.items() if count != 1} == {}
    assert len(lines) == len(view.hidden), [line for line in lines
                                            if not any(names_it(line, key) for key in view.hidden)][:20]
