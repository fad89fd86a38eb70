"""A worker connection's frames go out whole and in order, whether the socket
takes them at once (sent without a turn of the scheduler) or only in part."""

from __future__ import annotations

import socket

import trio
import trio.testing

from rapidmount.shared.messages import FrameReader, encode
from rapidmount.dataplane.pool import WorkerConnection

MiB = 1 << 20


def _connection() -> tuple[WorkerConnection, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    descriptors, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    return WorkerConnection(0, None, ours, descriptors, lambda kind, value: None), theirs  # type: ignore[arg-type]


def test_a_small_frame_goes_without_a_checkpoint():
    async def main():
        connection, theirs = _connection()
        with trio.testing.assert_no_checkpoints():
            await connection.send((1, "ping", ()))
        assert FrameReader().feed(theirs.recv(1000)) == [(1, "ping", ())]

    trio.run(main)


def test_frames_larger_than_the_socket_takes_arrive_whole_and_in_order():
    big = [bytes([i]) * (3 * MiB + i) for i in range(4)]

    async def main():
        connection, theirs = _connection()
        received: list = []

        def read_all() -> None:
            frames = FrameReader()
            while len(received) < 2 * len(big):
                received.extend(frames.feed(theirs.recv(1 << 20)))

        async def sender(index: int) -> None:
            await connection.send((index, "big", big[index]))
            await connection.send((index, "small", index))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, read_all)
            for index in range(len(big)):
                nursery.start_soon(sender, index)
        for index in range(len(big)):
            mine = [message for message in received if message[0] == index]
            assert mine == [(index, "big", big[index]), (index, "small", index)]
        assert len(encode(received[0])) > 3 * MiB

    trio.run(main)
