"""Modules that more than one process loads: the FUSE process, the workers, the emulator.

None runs an event loop or imports trio or asyncio: the FUSE kernel ABI and
its sans-I/O codec (the workers write READ replies too), the messages and the
shared-memory arena between the FUSE process and its workers, Storage v2's
protobuf conversions, CRC32C, credentials, logs and exit codes.
"""
