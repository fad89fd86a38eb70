"""Reading a gRPC stream with a stall timeout, without leaking.

``asyncio.wait_for(call.read(), timeout)`` cancels the task waiting in
``read()`` when the timeout passes (a task cancelled in ``read()`` of a
cancelled call is what left about 23 KiB in gRPC's core for good), and it
wraps every read in a task of its own. Here a timer cancels the *call*
instead and the read sees it end: one timer per message, no task.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

__all__ = ["read_within"]


class _Watchdog:
    __slots__ = ("call", "fired")

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.fired = False

    def fire(self) -> None:
        self.fired = True
        self.call.cancel()


async def read_within(call: grpc.aio.StreamStreamCall, timeout: float | None) -> Any:
    """``call.read()``; TimeoutError (the call cancelled) when nothing came for
    ``timeout`` seconds (None: wait for good). A cancellation of the caller
    itself goes on as such."""
    if timeout is None:
        return await call.read()
    watchdog = _Watchdog(call)
    timer = asyncio.get_running_loop().call_later(timeout, watchdog.fire)
    try:
        response = await call.read()
    except (asyncio.CancelledError, grpc.aio.AioRpcError):
        if watchdog.fired and not _being_cancelled():
            raise TimeoutError(f"no message for {timeout:g}s") from None
        raise
    finally:
        timer.cancel()
    if watchdog.fired:  # it fired as the message came: the call is cancelled all the same
        raise TimeoutError(f"no message for {timeout:g}s")
    return response


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
