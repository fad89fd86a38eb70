"""rapidmount's own FUSE layer: the kernel protocol, from ``linux/fuse.h``.

* :mod:`~rapidmount.shared.fuse_abi`: opcodes, flags and struct layouts of the kernel ABI;
* :mod:`~rapidmount.shared.fuse_codec`: requests decoded and replies and notifications
  encoded, with no I/O (a worker process uses it too);
* :mod:`~rapidmount.fuse.init`: the INIT negotiation, a pure function;
* :mod:`~rapidmount.fuse.mount`: ``/dev/fuse`` opened and mounted, and unmounted;
* :mod:`~rapidmount.fuse.loop`: the one request loop, every opcode through one table.
"""
