"""The storage seam over real data-plane worker processes, against an emulator.

``make_worker_store(endpoint, bucket)`` builds a :class:`WorkerStore`;
``run_with_workers(store, main)`` runs ``main()`` in trio with the store's
worker processes started for the run and stopped after it.
"""

from __future__ import annotations

import trio

from rapidmount.shared.arena import Arena
from rapidmount.dataplane.pool import WorkerPool
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.dataplane.store import WorkerStore
from rapidmount.fuse.write_pipes import WritePipes

MiB = 1 << 20


def worker_settings(endpoint: str, bucket: str, *, deadline: float = 5.0, stall_timeout: float = 10.0,
                    write_buffer: int = 8 * MiB, arena_size: int = 64 * MiB,
                    page_store_buffer: int = 0) -> WorkerSettings:
    return WorkerSettings(
        bucket=bucket, endpoint=endpoint, anonymous=True, directpath=False, ca_pem=None, billing_project=None,
        bucket_type="auto", tokens=False, connect_timeout=10.0, retry_deadline=deadline,
        stall_timeout=stall_timeout, write_buffer=write_buffer, arena_size=arena_size, log_level="warning",
        log_file=None, log_format="text", log_to_stderr=True, page_store_buffer=page_store_buffer)


def make_worker_store(endpoint: str, bucket: str, *, workers: int = 1, read_streams: int = 1,
                      arena_size: int = 64 * MiB, write_pipes: WritePipes | None = None, **settings) -> WorkerStore:
    arena = Arena(arena_size)
    pool = WorkerPool(worker_settings(endpoint, bucket, arena_size=arena.size, **settings), workers, arena,
                      write_pipes)
    holder: list[WorkerStore] = []

    async def probe() -> None:
        async with trio.open_nursery() as nursery:
            layout = await nursery.start(pool.run)
            holder.append(WorkerStore(pool, layout, read_streams=read_streams))
            await pool.stop()
            nursery.cancel_scope.cancel()

    trio.run(probe)
    return holder[0]


def run_with_workers(stores, main):
    """``await main()`` with the workers of ``stores`` (one or a list) running; its result."""
    stores = stores if isinstance(stores, list) else [stores]

    async def wrapper():
        async with trio.open_nursery() as nursery:
            for store in stores:
                await nursery.start(store.pool.run)
            try:
                return await main()
            finally:
                with trio.CancelScope(shield=True):
                    for store in stores:
                        await store.pool.stop()
                nursery.cancel_scope.cancel()

    return trio.run(wrapper)


def stat_bools(found: tuple) -> tuple:
    """A ``stat_name`` answer as (the object, whether the directory exists)."""
    return found[0], found[1] is not None
