"""The FUSE process's side of the data plane (trio): the workers' other end.

The FUSE process makes no gRPC call. :class:`.pool.WorkerPool` starts and
replaces the ``--workers`` worker processes (``rapidmount.workers``, asyncio),
and :class:`.store.WorkerStore` is the storage seam over them. Read bytes
arrive in the shared-memory arena (``rapidmount.shared.arena``), and the
mount replies to the kernel from it, or the workers do.
"""
