"""The local cache's directory on disk.

::

    DIR/            0700, owned by the daemon's user
      lock          flock(2)ed while a mount uses DIR; holds its pid
      index.json    the entries, least recently used first (replaced atomically)
      objects/      one 0600 file per entry, named by a hash of bucket, name, generation
      partial/      fills under way; emptied at every start

An entry's file is only ever written under ``partial/`` and renamed into
``objects/`` once complete and checked, so a daemon killed mid-fill leaves
nothing a restart would serve. The index is written after the rename: a file
the index does not name is deleted at start, and an entry whose file is
missing, of the wrong size or of the wrong CRC32C is dropped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
from pathlib import Path

from rapidmount.localcache.index import Entry, Index, IndexFormatError, Signature
from rapidmount.shared.checksums import file_crc32c

__all__ = ["CacheDirectory", "CacheDirError", "signature_of", "is_disk_fault"]

log = logging.getLogger("rapidmount.localcache")

class CacheDirError(Exception):
    """The directory cannot be used; the message is the one-line reason."""


def signature_of(st: os.stat_result) -> Signature:
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


class CacheDirectory:
    """The files of one cache directory. Blocking calls: run them off the event
    loop where they may read much (:meth:`check`)."""

    def __init__(self, root: str | os.PathLike[str], budget: int | None) -> None:
        """``budget`` None: 90% of what the file system has free at :meth:`open`,
        with what the cache holds already."""
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.partial = self.root / "partial"
        self._budget = budget
        self.index = Index(budget or 1)
        self._lock_fd: int | None = None

    # -- opening and closing ---------------------------------------------------------------------

    def open(self) -> None:
        """Take the directory: create it 0700, lock it, load the index, clear
        what an earlier run left half done. Raises :class:`CacheDirError`."""
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = self.root.stat()
        except OSError as err:
            raise CacheDirError(f"cannot create the cache directory {self.root}: {err.strerror or err}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise CacheDirError(f"the cache directory {self.root} is not a directory")
        if st.st_uid != os.geteuid():
            raise CacheDirError(f"the cache directory {self.root} belongs to uid {st.st_uid}, not to the daemon's "
                                f"uid {os.geteuid()}")
        try:
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(self.root, 0o700)  # nobody else may read the cached objects
            self._lock()
            for sub in (self.objects, self.partial):
                sub.mkdir(mode=0o700, exist_ok=True)
            self._clear_partial()
            self._load_index()
            if self._budget is None:
                fs = os.statvfs(self.root)
                self.index.budget = max(int(fs.f_bavail * fs.f_frsize * 0.9) + self.index.used, 1)
            self._delete_unindexed()
        except OSError as err:
            self.close()
            raise CacheDirError(f"cannot use the cache directory {self.root}: {err.strerror or err}") from None

    def _lock(self) -> None:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise CacheDirError(f"the cache directory {self.root} is in use by another rapidmount (pid {holder}); "
                                "give each mount its own --cache-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        """Let the directory go (the lock with it)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _clear_partial(self) -> None:
        for path in self.partial.iterdir():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _load_index(self) -> None:
        path = self.root / "index.json"
        try:
            document = json.loads(path.read_bytes())
            self.index.load(document)
        except FileNotFoundError:
            return
        except (ValueError, IndexFormatError) as err:
            log.warning("the local cache's index %s is unreadable (%s): starting empty", path, err)
            self.index = Index(self.index.budget)
            return
        if self._budget is None:
            return  # sized by the free space, after this
        for entry in self.index.over_budget():  # a smaller --cache-dir-size than last time
            self.delete(entry)

    def _delete_unindexed(self) -> None:
        known = {entry.key.file_name for entry in self.index}
        for path in self.objects.iterdir():
            if path.name not in known:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    # -- entries ---------------------------------------------------------------------------------

    def path_of(self, entry: Entry) -> Path:
        return self.objects / entry.key.file_name

    def delete(self, entry: Entry) -> None:
        """Remove an entry's file (it is already out of the index). Opens of it stay valid."""
        with contextlib.suppress(OSError):
            self.path_of(entry).unlink()

    def check(self, entry: Entry) -> bool:
        """Whether the entry's file is whole: its size and CRC32C, read in full.
        Blocking. A good file's signature is taken as it is now."""
        try:
            fd = os.open(self.path_of(entry), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if st.st_size != entry.size or file_crc32c(fd, entry.size) != entry.crc32c:
                return False
            entry.signature = signature_of(st)
            entry.verified = True
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def encode_index(self) -> bytes:
        return json.dumps(self.index.to_json(), separators=(",", ":")).encode()

    def save_index(self) -> None:
        """Write the index whole, atomically. Blocking; raises OSError."""
        self.write_index(self.encode_index())

    def write_index(self, document: bytes) -> None:
        """Write an encoded index whole, atomically. Blocking (run it in a
        thread: :meth:`encode_index` in the event loop first); raises OSError."""
        path = self.root / "index.json"
        temporary = self.root / f"index.json.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(document)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        os.close(fd)
        os.rename(temporary, path)


def is_disk_fault(err: OSError) -> bool:
    """An error of the cache's file system itself, which stops filling for a while."""
    return err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG)
