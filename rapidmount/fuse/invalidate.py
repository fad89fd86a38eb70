"""Tells the kernel to forget entries and attributes, off the request path.

An invalidation written to ``/dev/fuse`` blocks until related requests
finish, so it must not run inside a request handler: wishes are queued here
(a dict, so repeats collapse and memory stays bounded by the number of
names) and sent from a worker thread by :meth:`KernelNotifier.run`, a task
of the mount's nursery.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import trio

from rapidmount.shared import fuse_codec as codec
from rapidmount.fuse.channel import Channel

#: Past this many queued wishes the oldest are dropped: the TTLs still bound staleness.
MAX_PENDING = 65_536

_Wish = tuple[int, bytes | None]  # (inode, None) or (parent, name)


class KernelNotifier:
    """The core's :class:`~rapidmount.core.kernel.KernelCache`: ``entry(parent,
    name)`` and ``inode(ino)`` send one invalidation each, blocking."""

    def __init__(self, entry: Callable[[int, bytes], object], inode: Callable[[int], object]) -> None:
        self._entry = entry
        self._inode = inode
        self._pending: dict[_Wish, None] = {}
        self._wake = trio.Event()

    def forget_entry(self, parent_ino: int, name: str) -> None:
        self._queue((parent_ino, name.encode("utf-8", "surrogateescape")))

    def forget_attributes(self, ino: int) -> None:
        self._queue((ino, None))

    def _queue(self, wish: _Wish) -> None:
        self._pending[wish] = None
        while len(self._pending) > MAX_PENDING:
            self._pending.pop(next(iter(self._pending)))
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            wishes, self._pending = list(self._pending), {}
            await trio.to_thread.run_sync(self._send, wishes, abandon_on_cancel=True)

    def _send(self, wishes: list[_Wish]) -> None:
        for ino, name in wishes:
            # A refusal (ENOENT: the kernel did not know it) leaves nothing to forget.
            with contextlib.suppress(OSError):
                if name is None:
                    self._inode(ino)
                else:
                    self._entry(ino, name)


def over_channel(channel: Channel) -> KernelNotifier:
    """Invalidations written to the mount's ``/dev/fuse`` (offset 0, length
    0: the attributes and every cached page of the inode); a refusal raises,
    and the notifier lets it pass quietly."""
    return KernelNotifier(lambda parent, name: os.write(channel.fd, codec.notify_inval_entry(parent, name)),
                          lambda ino: os.write(channel.fd, codec.notify_inval_inode(ino, 0, 0)))
