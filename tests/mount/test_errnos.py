"""The errnos of docs/semantics.md that other test files do not reach."""

from __future__ import annotations

import ctypes
import errno
import os

import grpc
import pytest

from rapidmount.workers.client.errors import rpc_error
from rapidmount.emulator import Emulator
from tests.mountutil import errno_of, mounted

BUCKET = "errno-bucket"
RENAME_EXCHANGE = 2
AT_FDCWD = -100


@pytest.fixture(scope="module")
def mount():
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        emu.seed(BUCKET, "file.txt", b"hello")
        emu.seed(BUCKET, "other.txt", b"other")
        with mounted(emu.endpoint, BUCKET) as m:
            yield m




def test_readlink_of_a_regular_file_is_einval(mount):
    assert errno_of(lambda: os.readlink(mount.path / "file.txt")) == errno.EINVAL


def test_rename_exchange_is_einval(mount):
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.renameat2(AT_FDCWD, str(mount.path / "file.txt").encode(), AT_FDCWD,
                            str(mount.path / "other.txt").encode(), RENAME_EXCHANGE)
    assert result == -1 and ctypes.get_errno() == errno.EINVAL
    assert (mount.path / "file.txt").read_bytes() == b"hello"


def test_names_that_are_not_utf8_are_einval(mount):
    assert errno_of(lambda: os.mkdir(os.fsencode(str(mount.path)) + b"/bad-\xff")) == errno.EINVAL
    assert errno_of(lambda: open(os.fsencode(str(mount.path)) + b"/bad-\xfe.txt", "wb")) == errno.EINVAL


def test_write_on_a_read_only_handle_is_ebadf(mount):
    fd = os.open(mount.path / "file.txt", os.O_RDONLY)
    try:
        assert errno_of(lambda: os.write(fd, b"x")) == errno.EBADF
    finally:
        os.close(fd)


def test_mknod_and_mkfifo_are_enosys(mount):
    assert errno_of(lambda: os.mkfifo(mount.path / "fifo")) == errno.ENOSYS


def test_fallocate_is_eopnotsupp(mount):
    # The raw call: glibc's posix_fallocate() would emulate it by writing zeros.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
    fd = os.open(mount.path / "file.txt", os.O_RDWR)
    try:
        assert libc.fallocate(fd, 0, 0, 1 << 20) == -1
        assert ctypes.get_errno() in (errno.EOPNOTSUPP, errno.ENOTSUP)
    finally:
        os.close(fd)


def test_extended_attributes_are_enotsup(mount):
    path = mount.path / "file.txt"
    assert errno_of(lambda: os.getxattr(path, "user.x")) == errno.ENOTSUP
    assert errno_of(lambda: os.listxattr(path)) == errno.ENOTSUP
    assert errno_of(lambda: os.setxattr(path, "user.x", b"v")) == errno.ENOTSUP
    assert errno_of(lambda: os.removexattr(path, "user.x")) == errno.ENOTSUP
    assert path.read_bytes() == b"hello"


@pytest.mark.parametrize("code, expected", [
    (grpc.StatusCode.PERMISSION_DENIED, errno.EACCES),
    (grpc.StatusCode.UNAUTHENTICATED, errno.EACCES),
    (grpc.StatusCode.CANCELLED, errno.EINTR),
    (grpc.StatusCode.OUT_OF_RANGE, errno.EINVAL),
    (grpc.StatusCode.INVALID_ARGUMENT, errno.EINVAL),
    (grpc.StatusCode.FAILED_PRECONDITION, errno.ESTALE),
    (grpc.StatusCode.NOT_FOUND, errno.ENOENT),
    (grpc.StatusCode.UNAVAILABLE, errno.EIO),
])
def test_storage_status_to_errno(code, expected):
    """The mapping of gRPC statuses (e.g. access denied by storage) to errnos."""
    error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "details")
    assert rpc_error(error, "op").errno == expected
