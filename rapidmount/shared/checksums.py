"""CRC32C over any buffer without copying it, and over a file's first bytes.

The Python binding of google-crc32c takes only ``bytes``; its bundled C
library, called on a pointer, checksums a slice of a message or a view of
shared memory where it lies. No gRPC here: the core's local cache uses it.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

import google_crc32c

__all__ = ["crc32c_of", "crc32c_of_slice", "file_crc32c", "FILE_CHUNK"]

#: bytes read at a time when a file is checksummed
FILE_CHUNK = 8 << 20


def _load_crc32c_extend() -> Any:
    """The C ``crc32c_extend`` bundled with google-crc32c, callable on a pointer.

    The Python binding only takes ``bytes``; calling the library directly
    checksums a slice of a message without copying it out first.
    """
    package_dir = os.path.dirname(os.path.dirname(google_crc32c.__file__))
    for path in glob.glob(os.path.join(package_dir, "google_crc32c.libs", "libcrc32c*.so*")):
        try:
            extend = ctypes.CDLL(path).crc32c_extend
        except (OSError, AttributeError):
            continue
        extend.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
        extend.restype = ctypes.c_uint32
        return extend
    return None


_crc32c_extend = _load_crc32c_extend()


def crc32c_of_slice(buffer: bytes, start: int, end: int) -> int:
    """CRC32C of ``buffer[start:end]`` (``buffer`` must be ``bytes``)."""
    if _crc32c_extend is None:
        return int(google_crc32c.value(buffer[start:end]))
    base = ctypes.cast(ctypes.c_char_p(buffer), ctypes.c_void_p).value
    assert base is not None  # a bytes object's buffer is never NULL
    return int(_crc32c_extend(0, base + start, end - start))


def crc32c_of(buffer: Any, crc: int = 0) -> int:
    """CRC32C of any contiguous buffer (``bytes``, ``bytearray``, a writable
    ``memoryview``), extending ``crc``, without copying it."""
    length = len(buffer) if isinstance(buffer, bytes) else memoryview(buffer).nbytes
    if not length:
        return crc
    if _crc32c_extend is not None:
        if isinstance(buffer, bytes):
            return int(_crc32c_extend(crc, ctypes.cast(ctypes.c_char_p(buffer), ctypes.c_void_p).value, length))
        view = memoryview(buffer)
        if not view.readonly and view.contiguous:
            return int(_crc32c_extend(crc, ctypes.addressof(ctypes.c_char.from_buffer(view)), length))
    return int(google_crc32c.extend(crc, bytes(buffer)))


def file_crc32c(fd: int, size: int) -> int | None:
    """The CRC32C of the file's first ``size`` bytes; None if it has fewer.
    Blocking: run it in a thread."""
    crc, offset = 0, 0
    while offset < size:
        chunk = os.pread(fd, min(FILE_CHUNK, size - offset), offset)
        if not chunk:
            return None
        crc = crc32c_of(chunk, crc)
        offset += len(chunk)
    return crc
