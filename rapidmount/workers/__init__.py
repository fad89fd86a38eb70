"""The worker processes (asyncio and grpc.aio): every gRPC channel, stream and call.

``main`` is a worker's entry point; the FUSE process starts them through
``rapidmount.dataplane.pool``. ``client`` is the Storage v2 client they use,
``retry`` its one retry helper, ``tokens`` the access tokens the FUSE process
pushes, ``descriptors`` the file descriptors it hands over, ``pagestore`` the
writes into the kernel's page cache, and ``scan_batches`` scan-ahead's reads.
Nothing here imports trio.
"""
