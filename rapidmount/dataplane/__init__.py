"""The data plane: gRPC in worker processes, bytes in shared memory.

The FUSE process (trio, the mount's own FUSE loop) makes no gRPC call. ``--workers`` worker
processes (:mod:`.worker`, asyncio and grpc.aio) own every channel, stream
and call; :class:`.pool.WorkerPool` starts and replaces them, and
:class:`.store.WorkerStore` is the storage seam over them. Read bytes are
written by the workers into one shared-memory arena (:mod:`.arena`), and
the FUSE process replies to the kernel from it.
"""
