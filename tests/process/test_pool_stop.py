"""Stopping the pool stops every worker it started, including one that never
said "ready" (hung at its start): none outlives the mount."""

from __future__ import annotations

import os
import signal

import trio

from tests.conftest import ZONAL_BUCKET
from tests.workerstore import make_worker_store


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_worker_hung_before_it_was_ready_is_stopped_with_the_pool(emulator):
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2)
    pool = store.pool
    hung: list[int] = []

    async def hang_the_second(connection) -> None:
        if connection.index == 1 and not hung:
            hung.append(connection.pid)
            os.kill(connection.pid, signal.SIGSTOP)  # alive, never "ready"

    pool.started_notices.append(hang_the_second)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            while not hung:
                await trio.sleep(0.01)
            await pool.stop()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
        assert not _exists(hung[0]), "the worker hung at its start outlived the pool"
    finally:
        if hung and _exists(hung[0]):
            os.kill(hung[0], signal.SIGKILL)
