"""A worker's calls: :class:`Worker` takes each call the FUSE process sends,
runs it on its own task and sends back its one answer.

What a worker serves (``op`` of a call; see :mod:`rapidmount.shared.messages`),
each kind of call in a module of its own:

* ``client``: a unary Storage v2 call of :class:`StorageClient`, and
  ``write_object``: a whole upload, read from the FUSE process's staged file,
  whose descriptor the call passes (:mod:`~rapidmount.workers.unary_calls`);
* ``whole`` and ``composed``: scan-ahead's batches of small objects, each
  written into its arena region (:mod:`~rapidmount.workers.batch_calls`);
* ``reply``: the reply to one of the FUSE process's READs, from the arena,
  written to the mount's ``/dev/fuse`` (answered at once, on the loop);
  ``read``: a range of one stream, into the arena; ``read_blocks`` several;
  ``copy_held``: a block held by its page-cache store
  (:mod:`~rapidmount.workers.reads`);
* ``append``, ``append_arena``, ``append_peer``, ``append_file`` and
  ``appender``: an appendable object's stream (:mod:`~rapidmount.workers.appends`),
  whose bytes may come from WRITEs' pipes (:mod:`~rapidmount.workers.write_fills`);
* ``ping``: the FUSE process's heartbeat.

Notices (call id :data:`~rapidmount.shared.messages.NOTICE`) get no answer:
pushed tokens, closed streams, skipped stores, a log reopen, the fusectl
number of the mount's FUSE connection.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import pickle
import socket
from collections.abc import Callable
from typing import Any

from rapidmount.shared import auth, logs
from rapidmount.shared.arena import WorkerArena
from rapidmount.shared.messages import FAILED, NOTICE, OK, Message
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.storage.counters import RpcErrorCounts
from rapidmount.storage.errors import StorageError
from rapidmount.workers.appends import AppendCalls
from rapidmount.workers.batch_calls import BatchCalls
from rapidmount.workers.client.connect import connect
from rapidmount.workers.descriptors import DescriptorInbox
from rapidmount.workers.pagestore import PageStorer
from rapidmount.workers.reads import ReadCalls
from rapidmount.workers.store_reports import StoreReports
from rapidmount.workers.tokens import PushedTokens
from rapidmount.workers.unary_calls import UnaryCalls

log = logging.getLogger("rapidmount.worker")


class _ForwardedErrors(RpcErrorCounts):
    """Failed calls, counted by the FUSE process's metrics (sent as notices)."""

    def __init__(self, send: Callable[[Message], None]) -> None:
        super().__init__()
        self._send = send

    def add(self, method: str, code: object) -> None:
        self._send((NOTICE, "rpc_error", (method, getattr(code, "name", None) or str(code))))


class Worker(ReadCalls, AppendCalls, UnaryCalls, BatchCalls):
    """One worker process's calls, on its event loop; :func:`~rapidmount.workers.main.serve` feeds it."""

    def __init__(self, settings: WorkerSettings, arena: WorkerArena, writer: asyncio.StreamWriter,
                 descriptor_socket: socket.socket, parent: int, peer_refusal: str | None,
                 write_pipes: dict[int, int] | None = None) -> None:
        self.settings = settings
        self.arena = arena
        self.parent = parent
        self.peer_refusal = peer_refusal
        self._writer = writer
        self.ended = collections.OrderedDict()
        self.tasks = set()
        self.tokens: PushedTokens | None = None
        if settings.tokens:
            loop = asyncio.get_running_loop()
            self.tokens = PushedTokens(
                lambda: loop.call_soon_threadsafe(self.send, (NOTICE, "token_wanted", None)),
                lambda serial: self.send((NOTICE, "token_refused", serial)))
        self.reauth = self.tokens.reauth() if self.tokens is not None else None
        self.store_reports = StoreReports(asyncio.get_running_loop(), self.send)
        self.pages = PageStorer(settings.page_store_buffer, self.store_reports.add)
        self.descriptors = DescriptorInbox(descriptor_socket, self.pages.use_device, self._new_write_pipe)
        # Each kind of call's own state.
        self.readers = {}
        self.appenders = {}
        self._gates = {}
        self.write_pipes = write_pipes or {}
        self.fills_done = 0
        self._fill_waiting = False
        self._fill_futures = []
        #: fusectl's number of the mount's FUSE connection, once the FUSE process told it.
        self.fuse_connection: int | None = None

    async def start(self) -> None:
        credentials = auth.call_credentials(self.tokens) if self.tokens is not None else None
        self.client, self.layout = await connect(self.settings, credentials, self.reauth)
        self.retry = self.client.retry
        self.client.rpc_errors = _ForwardedErrors(self.send)

    # -- calls -------------------------------------------------------------------------------------

    def dispatch(self, call_id: int, op: str, args: Message, passes_descriptor: bool = False) -> None:
        if call_id == NOTICE:
            self._notice(op, args)
            return
        if op == "reply":  # one writev: answered at once, without a task of its own
            self.send((call_id, OK, self.reply(*args)))
            return
        self.spawn(self._answer(call_id, op, args, passes_descriptor))

    def _notice(self, kind: str, payload: Any) -> None:
        if kind == "token":
            if self.tokens is not None:
                self.tokens.push(*payload)
        elif kind == "token_failed":
            if self.tokens is not None:
                self.tokens.push_failure(payload)
        elif kind == "close_reader":
            self._end(payload)
            reader = self.readers.pop(payload, None)
            if reader is not None:
                self.spawn(reader.close())
        elif kind == "forget_appender":
            self._end(payload)
            writer = self.appenders.pop(payload, None)
            if writer is not None:
                self.spawn(writer.abort())
        elif kind == "skip_store":
            self.pages.skip(payload)
        elif kind == "reopen_logs":
            logs.reopen()
        elif kind == "fuse_connection":
            self.fuse_connection = payload
            log.debug("the mount's FUSE connection is %d (fusectl)", payload)

    async def _answer(self, call_id: int, op: str, args: Message, passes_descriptor: bool) -> None:
        try:
            if passes_descriptor:
                fd = await self.descriptors.take(call_id, self.settings.retry_deadline)
                try:
                    result = await getattr(self, "op_" + op)(*args, fd=fd)
                finally:
                    os.close(fd)
            else:
                result = await getattr(self, "op_" + op)(*args)
        except StorageError as err:
            self.send((call_id, FAILED, err))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this worker is stopping: the FUSE process sees it gone
            # grpc.aio raises CancelledError in whoever awaits a call that was
            # cancelled under it (a stream aborted by another call): an answer
            # is still owed, or the caller would wait for good.
            self.send((call_id, FAILED, StorageError(f"{op}: its stream was cancelled", errno_=errno.EIO)))
        except Exception as err:  # noqa: BLE001 - one line to the caller, never a silent hang
            log.warning("data-plane call %s failed: %s: %s", op, type(err).__name__, err)
            self.send((call_id, FAILED, StorageError(f"{op}: {type(err).__name__}: {err}")))
        else:
            try:
                self.send((call_id, OK, result))
            except (pickle.PicklingError, TypeError) as err:  # a bug, but never a hang
                self.send((call_id, FAILED, StorageError(f"{op}: cannot send the result: {err}")))

    async def op_ping(self) -> None:
        """The FUSE process's heartbeat: answered as soon as this event loop turns."""
        return None
