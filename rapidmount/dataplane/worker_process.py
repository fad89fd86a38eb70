"""A data-plane worker as a process: starting one with the sockets and
descriptors it inherits, and what the system says of one (its private
memory, its exit status).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import trio

from rapidmount.dataplane.connection import WorkerConnection
from rapidmount.fuse.write_pipes import WritePipes
from rapidmount.shared import allocator
from rapidmount.shared.arena import Arena
from rapidmount.shared.worker_settings import WorkerSettings


async def start_worker(index: int, settings: WorkerSettings, arena: Arena, write_pipes: WritePipes | None,
                       on_notice: Callable[[str, object], None],
                       on_lost: Callable[[WorkerConnection], None]) -> WorkerConnection:
    """Start the worker of slot ``index`` on its end of a socket pair, the
    arena, a descriptor socket and, with WRITE pipes, their read ends and a
    fill socket; its connection, not told anything yet."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    descriptors_ours, descriptors_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pipes = write_pipes.read_ends() if write_pipes is not None else []
    fills_ours, fills_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if pipes else (None, None)
    try:
        command = [sys.executable, "-m", "rapidmount.workers.main", "--socket-fd", str(theirs.fileno()),
                   "--arena-fd", str(arena.fd), "--fd-socket", str(descriptors_theirs.fileno()),
                   "--index", str(index)]
        passed = [theirs.fileno(), arena.fd, descriptors_theirs.fileno()]
        if fills_theirs is not None:
            command += ["--write-pipes", ",".join(f"{pipe_id}:{fd}" for pipe_id, fd in pipes),
                        "--fill-socket", str(fills_theirs.fileno())]
            passed += [fd for _, fd in pipes] + [fills_theirs.fileno()]
        # Logs go to the log file, or to stderr in the foreground; a
        # daemon's workers hold no terminal and no caller's pipe open.
        process = await trio.lowlevel.open_process(
            command, pass_fds=passed, env=allocator.worker_environment(settings.allocator),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=None if settings.log_to_stderr else subprocess.DEVNULL)
    except BaseException:
        ours.close()
        descriptors_ours.close()
        if fills_ours is not None:
            fills_ours.close()
        raise
    finally:
        theirs.close()
        descriptors_theirs.close()
        if fills_theirs is not None:
            fills_theirs.close()
    ours.setblocking(False)
    descriptors_ours.setblocking(False)
    if fills_ours is not None:
        fills_ours.setblocking(False)
    return WorkerConnection(index, process, ours, descriptors_ours, on_notice, on_lost,
                            frozenset(pipe_id for pipe_id, _ in pipes), fills_ours)


def private_memory(status: str) -> int | None:
    """Bytes of a process's private memory (``RssAnon``: heap and anonymous
    maps, not shared memory) from the text of its /proc/PID/status."""
    for line in status.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return None


def _private_memory_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            return private_memory(status.read())
    except OSError:  # gone, or no /proc
        return None


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "no status"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"
