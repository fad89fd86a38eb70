"""The worker processes (asyncio and grpc.aio): every gRPC channel, stream and call.

``main`` is a worker's entry point; the FUSE process starts them through
``rapidmount.dataplane.pool``. ``worker`` takes each call and answers it, with
one module per kind of call: ``reads``, ``appends`` (and ``write_fills``, the
WRITEs whose bytes come through pipes), ``unary_calls`` and ``batch_calls``;
``state`` is what they share and ``store_reports`` the page stores' outcomes
sent back. ``client`` is the Storage v2 client they use,
``retry`` its one retry helper, ``tokens`` the access tokens the FUSE process
pushes, ``descriptors`` the file descriptors it hands over, ``pagestore`` the
writes into the kernel's page cache, and ``scan_batches`` scan-ahead's reads.
Nothing here imports trio.
"""
