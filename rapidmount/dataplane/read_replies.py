"""READ replies written by the workers: the mount's answer to a READ whose
bytes are in the shared-memory arena goes to ``/dev/fuse`` from a worker
(a ``reply`` call with the arena ranges), not from this process.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import cast

import trio

from rapidmount.dataplane.connection import WorkerConnection, WorkerLost
from rapidmount.dataplane.pool import WorkerPool
from rapidmount.shared.arena import Arena
from rapidmount.shared.messages import Message
from rapidmount.shared.views import pieces


class ReadReplies:
    """:class:`~rapidmount.dataplane.store.WorkerStore`'s READ replies, each
    written by a worker taken in turn."""

    # Set by WorkerStoreBase, which WorkerStore is made of too.
    arena: Arena
    pool: WorkerPool
    _turns: itertools.count[int]  # shared with the readers' first workers

    async def answer_read(self, unique: int, data: object) -> bool:
        """Have a worker write the reply to READ ``unique``: ``data``, a view of
        the arena, kept until the worker answers. False (nothing written) when
        ``data`` is not in the arena, no worker runs, or the kernel refused it."""
        call = self._reply_call(unique, data)
        if call is None:
            return False
        connection, args = call
        try:
            taken: bool = await connection.call("reply", args, keep=data)
        except WorkerLost:
            return False  # the FUSE process answers; the kernel refuses it if the worker had
        return taken

    async def answer_read_soon(self, unique: int, data: object, on_answer: Callable[[bool], None]) -> bool:
        """As :meth:`answer_read`, without waiting for the worker: True once
        the call is sent (``on_answer(taken)`` runs at its answer, and with
        False if the worker dies first); False when ``data`` is not in the
        arena or no worker runs (nothing sent, ``on_answer`` never runs).
        ``data`` is kept until the answer."""
        call = self._reply_call(unique, data)
        if call is None:
            return False
        connection, args = call
        with trio.CancelScope(shield=True):  # sent whole, or answered as lost: never left waiting
            await connection.call_soon("reply", args, _reply_taken(on_answer), keep=data)
        return True

    def answer_read_now(self, unique: int, data: object, on_answer: Callable[[bool], None]) -> bool:
        """As :meth:`answer_read_soon`, sent at once or not at all: False (nothing
        sent) also while the worker's socket cannot take the call now."""
        call = self._reply_call(unique, data)
        if call is None:
            return False
        connection, args = call
        return connection.call_now("reply", args, _reply_taken(on_answer), keep=data)

    def _reply_call(self, unique: int, data: object) -> tuple[WorkerConnection, Message] | None:
        """The worker (taken in turn) and the arguments of a ``reply`` call for
        READ ``unique`` with ``data``; None when ``data`` is not in the arena
        or no worker runs."""
        ranges = []
        for part in pieces(data):
            offset = self.arena.offset_of(part)
            if offset is None:
                return None
            ranges.append((offset, cast(memoryview, part).nbytes))
        live = self.pool.live()
        if not live:
            return None
        return live[next(self._turns) % len(live)], (unique, ranges)


def _reply_taken(on_answer: Callable[[bool], None]) -> Callable[[bool, object], None]:
    """A ``reply`` call's answer as ``on_answer(taken)``: False too if the worker died first."""
    def answered(ok: bool, value: object) -> None:
        on_answer(ok and value is True)
    return answered
