"""Every call a worker takes gets one answer, even when grpc.aio cancels the
call's stream under it; only a worker that is itself stopping answers nothing."""

from __future__ import annotations

import asyncio
import errno

import pytest

from rapidmount.shared.messages import FAILED, OK
from rapidmount.workers.worker import Worker


def _worker(op) -> tuple[Worker, list]:
    worker = object.__new__(Worker)  # no client, no sockets: only the answering is under test
    sent: list = []
    worker.send = sent.append  # type: ignore[method-assign]
    worker.op_probe = op  # type: ignore[attr-defined]
    return worker, sent


def test_a_call_whose_stream_was_cancelled_under_it_is_answered_eio():
    async def cancelled_stream():
        raise asyncio.CancelledError()  # what grpc.aio raises in a reader of a cancelled call

    worker, sent = _worker(cancelled_stream)
    asyncio.run(worker._answer(7, "probe", (), False))
    ((call_id, kind, error),) = sent
    assert (call_id, kind, error.errno) == (7, FAILED, errno.EIO)


def test_a_call_that_returns_is_answered_ok():
    async def fine():
        return 42

    worker, sent = _worker(fine)
    asyncio.run(worker._answer(8, "probe", (), False))
    assert sent == [(8, OK, 42)]


def test_a_stopping_worker_answers_nothing():
    async def main(sent: list) -> None:
        started = asyncio.Event()

        async def forever():
            started.set()
            await asyncio.Event().wait()

        worker, sent[:] = _worker(forever)[0], []
        worker.send = sent.append  # type: ignore[method-assign]
        task = asyncio.ensure_future(worker._answer(9, "probe", (), False))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    sent: list = []
    asyncio.run(main(sent))
    assert sent == []
