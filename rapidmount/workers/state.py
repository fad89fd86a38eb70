"""What every kind of call a worker serves shares: its settings, the arena,
the Storage client, the page stores, the way back to the FUSE process, and
the streams closed lately.

:class:`WorkerState` is the base of the classes that each serve one kind of
call (reads, appends, unary calls, batches); :class:`~rapidmount.workers.worker.Worker`
joins them and sets this state up.
"""

from __future__ import annotations

import asyncio
import collections
import errno
from collections.abc import Coroutine
from typing import Any

from rapidmount.shared.arena import WorkerArena
from rapidmount.shared.messages import NOTICE, Message, encode
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import BucketLayout
from rapidmount.workers.client.storage import StorageClient
from rapidmount.workers.pagestore import PageStorer
from rapidmount.workers.retry import RetryPolicy

#: How many closed stream ids the worker remembers (a call crosses a close
#: within milliseconds; this bounds the memory).
ENDED_KEPT = 4096


class WorkerState:
    """The state every call uses (set by ``Worker.__init__``, the client's by
    ``Worker.start``) and the helpers to answer, track streams and run tasks."""

    settings: WorkerSettings
    arena: WorkerArena
    #: The FUSE process, and why appended bytes cannot be read from its memory (None: they can).
    parent: int
    peer_refusal: str | None
    _writer: asyncio.StreamWriter
    client: StorageClient  # set by start(), before any call is taken
    layout: BucketLayout
    retry: RetryPolicy  # the client's, once connected
    pages: PageStorer
    # Ids closed lately: a call can cross its stream's close on the way (sent
    # before it, run after it), and must not open a stream nobody closes.
    ended: collections.OrderedDict[int, None]
    tasks: set[asyncio.Task[None]]

    def send(self, message: Message) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode(message))

    def _on_read_event(self, event: str) -> None:
        self.send((NOTICE, "event", ("read", event)))

    def _on_write_event(self, event: str) -> None:
        self.send((NOTICE, "event", ("write", event)))

    def _end(self, stream_id: int) -> None:
        self.ended[stream_id] = None
        if len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)

    def _check_open(self, stream_id: int) -> None:
        if stream_id in self.ended:
            raise StorageError("the stream was closed", errno_=errno.EBADF)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` on a task of its own, cancelled when the worker stops."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
