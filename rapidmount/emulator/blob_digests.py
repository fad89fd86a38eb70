"""Whole-blob checksums (CRC32C, MD5), read a bounded chunk at a time."""

from __future__ import annotations

import hashlib

import google_crc32c

from .blobs import FileBlobs, MemoryBlobs

#: Bytes read per step when hashing or copying a stored blob.
HASH_CHUNK = 8 * 1024 * 1024


def crc32c_of(blobs: MemoryBlobs | FileBlobs, blob_id: int, size: int) -> int:
    crc = 0
    for offset in range(0, size, HASH_CHUNK):
        crc = google_crc32c.extend(crc, blobs.read(blob_id, offset, min(HASH_CHUNK, size - offset)))
    return crc


def md5_of(blobs: MemoryBlobs | FileBlobs, blob_id: int, size: int) -> bytes:
    digest = hashlib.md5()
    for offset in range(0, size, HASH_CHUNK):
        digest.update(blobs.read(blob_id, offset, min(HASH_CHUNK, size - offset)))
    return digest.digest()
