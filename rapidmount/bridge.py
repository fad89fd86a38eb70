"""The one bridge between trio (FUSE side) and grpc.aio (wire side).

grpc.aio runs on an asyncio loop in one dedicated thread. trio code awaits a
coroutine on that loop with :meth:`GrpcBridge.call`: the coroutine becomes a
task there (``loop.call_soon_threadsafe``) and the task's completion wakes
the trio task through ``TrioToken.run_sync_soon``. That is one thread
crossing each way per call, and no worker thread per in-flight operation,
which was the fastest bridge measured on this kind of machine. Callers
therefore cross once per FUSE operation (or per cache block), never once per
gRPC chunk.

Cancelling the trio task cancels the asyncio task, and the trio task resumes
only once the asyncio task has finished, so cancellation is complete in both
directions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


class BridgeClosed(RuntimeError):
    """The asyncio side has shut down."""


class GrpcBridge:
    """Owns the asyncio thread that runs every grpc.aio channel and call."""

    def __init__(self, name: str = "rapidmount-grpc") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        # Guards _closing: once set, no new call may be scheduled on the loop.
        self._schedule_lock = threading.Lock()
        self._closing = False

    # -- lifecycle (called from any thread; blocking) ------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        # The loop is created inside its own thread: creating it from a thread
        # that runs trio can fail when trio-asyncio is imported.
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._stopping = asyncio.Event()
        self._ready.set()
        try:
            loop.run_until_complete(self._stopping.wait())
            with self._schedule_lock:
                self._closing = True
            # Start what was scheduled before closing, then cancel everything,
            # so that every waiting trio task is woken with an outcome.
            loop.run_until_complete(asyncio.sleep(0))
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop after cancelling every task on it (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:
                pass
        thread.join(timeout)
        self._thread = None
        self._loop = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise BridgeClosed("the gRPC thread is not running")
        return self._loop

    def _schedule(self, callback: Callable[[], None]) -> None:
        with self._schedule_lock:
            if self._closing or self._loop is None:
                raise BridgeClosed("the gRPC thread has stopped")
            try:
                self._loop.call_soon_threadsafe(callback)
            except RuntimeError:
                raise BridgeClosed("the gRPC thread has stopped") from None

    # -- crossing --------------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Schedule ``fn(*args, **kwargs)`` on the gRPC loop from any thread."""
        loop = self.loop
        if loop.is_closed():
            raise BridgeClosed("the gRPC thread has stopped")
        return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), loop)

    def run_blocking(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(*args)`` on the gRPC loop and block for its result.

        For start-up and shut-down code outside trio only.
        """
        return self.submit(fn, *args).result(timeout)

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` running on the gRPC loop, from trio.

        The trio task is woken by the asyncio task's own completion, so after
        a cancellation it resumes only once the asyncio side has really
        finished: nothing keeps running behind the caller's back.
        """
        token = trio.lowlevel.current_trio_token()
        waiter = trio.lowlevel.current_task()
        loop = self.loop
        box: dict[str, asyncio.Task] = {}

        def finished(task: asyncio.Task) -> None:  # gRPC thread
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, waiter)
            except trio.RunFinishedError:
                pass

        def start() -> None:  # gRPC thread
            task = loop.create_task(fn(*args, **kwargs))
            box["task"] = task
            task.add_done_callback(finished)

        self._schedule(start)

        def abort(_: object) -> trio.lowlevel.Abort:
            def cancel() -> None:  # gRPC thread; runs after start() (FIFO)
                task = box.get("task")
                if task is not None:
                    task.cancel()
            try:
                loop.call_soon_threadsafe(cancel)
            except RuntimeError:
                pass  # the loop is shutting down and cancels every task itself
            return trio.lowlevel.Abort.FAILED

        await trio.lowlevel.wait_task_rescheduled(abort)
        task = box["task"]
        if task.cancelled():
            # Our own abort cancelled it: surface trio's cancellation.
            await trio.lowlevel.checkpoint()
            raise BridgeClosed("gRPC call was cancelled without a trio cancellation")
        return task.result()
