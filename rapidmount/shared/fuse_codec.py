"""The FUSE kernel protocol without I/O: requests decoded from the bytes read
from ``/dev/fuse``, replies and notifications encoded as the bytes to write.

No I/O happens here, so the request loop and a data-plane worker share it and
tests drive it with plain bytes. The codec speaks protocol 7.31 to 7.45
(:data:`abi.MIN_MINOR` to :data:`abi.MAX_MINOR`). This module is where its
users import it from; it is made of:

* :mod:`~rapidmount.shared.fuse_requests`: the requests, as frozen dataclasses;
* :mod:`~rapidmount.shared.fuse_decode`: :func:`decode`, which trusts nothing:
  whatever the buffer holds, it returns a request or raises
  :class:`DecodeError` with the errno to answer;
* :mod:`~rapidmount.shared.fuse_replies`: the replies and notifications encoded.
"""

from __future__ import annotations

from rapidmount.shared.fuse_abi import Buffer
from rapidmount.shared.fuse_decode import DECODED_OPCODES, DecodeError, decode
from rapidmount.shared.fuse_replies import (
    Dirents, notify_delete, notify_inval_entry, notify_inval_inode, notify_store_header, reply_attr, reply_create,
    reply_data, reply_empty, reply_entry, reply_error, reply_header, reply_init, reply_lseek, reply_negative_entry,
    reply_open, reply_readlink, reply_statfs, reply_write, reply_xattr_size, StatLike, TIMEOUT_FOREVER)
from rapidmount.shared.fuse_requests import (
    Access, BatchForget, Body, CopyFileRange, Create, Destroy, Fallocate, Flush, Forget, Fsync, Getattr, Getxattr,
    Header, Init, Interrupt, Link, Listxattr, Lookup, Lseek, Mkdir, Mknod, Open, Opendir, Read, Readdir, Readlink,
    Release, Removexattr, Rename, Rmdir, Setattr, Setxattr, Statfs, Symlink, Unlink, Write)

__all__ = [
    "Access", "BatchForget", "Body", "Buffer", "CopyFileRange", "Create", "DECODED_OPCODES", "DecodeError",
    "Destroy", "Dirents", "Fallocate", "Flush", "Forget", "Fsync", "Getattr", "Getxattr", "Header", "Init",
    "Interrupt", "Link", "Listxattr", "Lookup", "Lseek", "Mkdir", "Mknod", "Open", "Opendir", "Read", "Readdir",
    "Readlink", "Release", "Removexattr", "Rename", "Rmdir", "Setattr", "Setxattr", "StatLike", "Statfs", "Symlink",
    "TIMEOUT_FOREVER", "Unlink", "Write", "decode", "notify_delete", "notify_inval_entry", "notify_inval_inode",
    "notify_store_header", "reply_attr", "reply_create", "reply_data", "reply_empty", "reply_entry", "reply_error",
    "reply_header", "reply_init", "reply_lseek", "reply_negative_entry", "reply_open", "reply_readlink",
    "reply_statfs", "reply_write", "reply_xattr_size",
]
