"""What a worker process needs to know to serve one mount (sent at its start)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSettings:
    bucket: str
    endpoint: str
    anonymous: bool
    directpath: bool
    ca_pem: bytes | None  # read by the FUSE process, so a bad file fails the mount once
    billing_project: str | None
    bucket_type: str  # auto, zonal or regional
    tokens: bool  # calls carry an access token the FUSE process pushes
    connect_timeout: float
    retry_deadline: float
    stall_timeout: float
    write_buffer: int
    arena_size: int
    log_level: str
    log_file: str | None
    log_format: str
    log_to_stderr: bool
    #: Private memory (bytes) past which the pool replaces a worker; 0: no limit.
    memory_limit: int = 0
    #: The workers' malloc: ``jemalloc`` (preloaded) or ``glibc``, resolved at mount.
    allocator: str = "glibc"
    #: Bytes a worker may hold waiting to be stored into the kernel's page
    #: cache (``workers/pagestore.py``); 0: no stores.
    page_store_buffer: int = 0
    #: Where a worker checks at its start that it can read appended bytes
    #: straight from the FUSE process's memory: the address of bytes that
    #: process holds, and those bytes. None: appends go through the arena.
    peer_probe: tuple[int, bytes] | None = None
