"""A data-plane worker process's entry point: one process that owns gRPC
channels, streams and calls.

Started by the FUSE process (``python -m rapidmount.workers.main``) with
one end of a socket pair, one end of its descriptor socket and the
shared-memory arena as inherited file descriptors. It runs its own asyncio
loop (grpc.aio) and so its own GIL: receiving, decoding and checking CRC32C
of the bytes happens here, and the bytes go straight into the arena.

This module sets the process up (signals, malloc, logs, the arena), reads the
settings, connects and feeds each call from the socket to the
:class:`~rapidmount.workers.worker.Worker`, which answers it. Whether this
worker can read the FUSE process's memory (for appended bytes) is probed at
its start and told in the ``peer_reads`` notice, before ``ready``.

The worker exits when its socket closes: the FUSE process unmounts, or dies
(the kernel closes its end of the socket even after SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from rapidmount.shared import allocator, logs, peer_memory
from rapidmount.shared.arena import WorkerArena
from rapidmount.shared.exits import MountError
from rapidmount.shared.messages import FRAME_HEADER, NOTICE, FrameReader
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.workers.pagestore import abort_connection
from rapidmount.workers.worker import Worker

#: How long a worker whose socket closed while a store sleeps waits to see
#: its FUSE process gone (a process that exits closes its descriptors first).
PARENT_EXIT_S = 2.0


async def _release_free_memory() -> None:
    while await asyncio.to_thread(allocator.release_free_memory):
        await asyncio.sleep(allocator.TRIM_INTERVAL_S)


async def serve(settings: WorkerSettings, sock: socket.socket, arena: WorkerArena,
                descriptor_socket: socket.socket, parent: int, peer_refusal: str | None, *,
                trim: bool = True, write_pipes: dict[int, int] | None = None,
                fills: socket.socket | None = None) -> int:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    worker = Worker(settings, arena, writer, descriptor_socket, parent, peer_refusal, write_pipes)
    worker.pages.start()
    if fills is not None:
        fills.setblocking(True)
        worker.start_fills(fills)
    worker.descriptors.start()
    frames = FrameReader()

    async def pump() -> None:
        # Token pushes may arrive while connecting; calls come only after "ready".
        while data := await reader.read(1 << 20):
            for message in frames.feed(data):
                worker.dispatch(*message)
            await writer.drain()

    pumping = asyncio.get_running_loop().create_task(pump())
    try:
        await worker.start()
    except MountError as err:
        worker.send((NOTICE, "fatal", str(err)))
        await writer.drain()
        pumping.cancel()
        return 1
    worker.send((NOTICE, "peer_reads", worker.peer_refusal))
    worker.send((NOTICE, "ready", worker.layout))
    if trim:  # glibc's malloc; jemalloc gives idle pages back by itself
        worker.spawn(_release_free_memory())
    try:
        await pumping  # until the FUSE process closes the socket: unmounting, or gone
    except ConnectionError:
        pass
    if worker.pages.close() and await _parent_gone(parent, lambda: worker.pages.storing):
        # The FUSE process died (not an unmount: it would have waited for us)
        # while a store sleeps on a page only it could release.
        abort_connection(worker.fuse_connection)
    worker.descriptors.close()
    worker.store_reports.flush()
    for task in list(worker.tasks):
        task.cancel()
    # A socket reset at unmount (the FUSE process closed it with answers unread)
    # is kept by the stream's close future too: take it, or asyncio logs it at exit.
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass
    await worker.client.channel.close(grace=0.5)
    return 0


async def _parent_gone(parent: int, waiting: Callable[[], bool]) -> bool:
    """Whether the FUSE process died, asked while ``waiting()`` (a store
    sleeps): True once this worker has another parent. A dying process
    closes its descriptors, which ends our socket, before its children are
    given to another parent, so a first look may still find it."""
    deadline = time.monotonic() + PARENT_EXIT_S
    while os.getppid() == parent:
        if not waiting() or time.monotonic() > deadline:
            return False  # the store ended (an unmount), or the process lives on
        await asyncio.sleep(0.01)
    return waiting()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a rapidmount data-plane worker (started by the mount)")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--arena-fd", type=int, required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--fd-socket", type=int, required=True,
                        help="the descriptor socket: staged files to upload, and /dev/fuse for page-cache stores")
    parser.add_argument("--write-pipes", default="",
                        help="ID:FD,...: the pipes large WRITEs' bytes come in (read ends, inherited)")
    parser.add_argument("--fill-socket", type=int, default=None,
                        help="the socket the WRITEs whose bytes wait in those pipes come on")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the mount decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    on_glibc = not allocator.jemalloc_is_malloc()
    if on_glibc:
        allocator.share_one_arena()  # before gRPC starts its threads
        allocator.retain_large_buffers()  # chunks arrive and leave here: reuse their memory
    sock = socket.socket(fileno=args.socket_fd)
    sock.setblocking(True)
    settings: WorkerSettings = _read_message(sock)
    logs.setup(settings.log_level, settings.log_file, settings.log_to_stderr, settings.log_format)
    arena = WorkerArena(args.arena_fd, settings.arena_size)
    os.close(args.arena_fd)
    sock.setblocking(False)
    descriptor_socket = socket.socket(fileno=args.fd_socket)
    parent = os.getppid()  # the FUSE process: it started this one
    peer_refusal = peer_memory.probe(parent, *settings.peer_probe) if settings.peer_probe else "not offered"
    try:
        fills = socket.socket(fileno=args.fill_socket) if args.fill_socket is not None else None
        return asyncio.run(serve(settings, sock, arena, descriptor_socket, parent, peer_refusal, trim=on_glibc,
                                 write_pipes=parse_write_pipes(args.write_pipes), fills=fills))
    except (ConnectionError, BrokenPipeError):
        return 0


def parse_write_pipes(text: str) -> dict[int, int]:
    """``ID:FD,...`` -> {id: fd}."""
    pipes = {}
    for item in filter(None, text.split(",")):
        pipe_id, fd = item.split(":")
        pipes[int(pipe_id)] = int(fd)
    return pipes


def _read_message(sock: socket.socket) -> Any:
    """The settings message, read before the event loop starts."""
    header = _recv_exactly(sock, FRAME_HEADER)
    (message,) = FrameReader().feed(header + _recv_exactly(sock, int.from_bytes(header[:4], "little")))
    return message


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            sys.exit(0)
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


if __name__ == "__main__":
    raise SystemExit(main())
