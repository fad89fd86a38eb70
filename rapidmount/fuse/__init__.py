"""rapidmount's own FUSE layer (FUSE process, trio): the kernel protocol, from ``linux/fuse.h``.

* :mod:`~rapidmount.shared.fuse_abi` and :mod:`~rapidmount.shared.fuse_codec` (in
  ``shared/``: a worker process uses them too): the kernel ABI, and requests
  decoded and replies and notifications encoded, with no I/O;
* :mod:`~rapidmount.fuse.init`: the INIT negotiation, a pure function;
* :mod:`~rapidmount.fuse.mount`: ``/dev/fuse`` opened and mounted, and unmounted;
* :mod:`~rapidmount.fuse.loop`: the one request loop, every opcode through one table
  (:mod:`~rapidmount.fuse.operations`);
* :mod:`~rapidmount.fuse.write_pipes`: large WRITEs spliced into pipes for the workers;
* :mod:`~rapidmount.fuse.reference`: pyfuse3 as the reference loop.
"""
