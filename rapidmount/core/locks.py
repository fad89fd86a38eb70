"""A trio lock taken without a trip through the scheduler when it is free.

``async with trio.Lock()`` always yields to the scheduler once, even when
nobody holds the lock, so that every trio call is a checkpoint. On the
write path that is a full turn of the run loop (and an ``epoll_wait``) per
lock per WRITE, for locks that are almost never contended. This one takes a
free lock at once and waits, fairly, in trio's lock otherwise: a holder's
release hands it to the first waiter, so a waiter is never overtaken.
"""

from __future__ import annotations

from types import TracebackType

import trio

__all__ = ["QuickLock"]


class QuickLock:
    """``async with`` it: one task at a time; no checkpoint when it is free."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = trio.Lock()

    def locked(self) -> bool:
        return self._lock.locked()

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self._lock.release()
