"""The local cache (``--cache-dir``): whole objects on local disk.

An object read through the mount is copied whole into a file of the cache
directory; later opens of the same generation are served from that file, by
the kernel itself through FUSE passthrough where it may, else by the FUSE
process with ``pread``. No gRPC either way.

- ``index``: which entries exist, their checksums and their order of use;
  no I/O.
- ``directory``: the directory on disk: its lock, the index file, checks at
  start, files that are dropped or evicted.
- ``fill``: copying one object generation into the directory.
- ``cache``: what the filesystem core asks: an open, a change of a name.
"""
