"""``/dev/fuse`` opened and mounted, and unmounted, the way libfuse 3 does it.

The mount holds its descriptor from the start (no search of /proc/self/fd):

* with ``auto_unmount``, or without root, ``fusermount3`` (setuid root) mounts
  and sends the descriptor back over a socket pair named by ``_FUSE_COMMFD``.
  With ``auto_unmount`` it then stays, waiting on that socket, and unmounts
  once it reads EOF there, i.e. once this process died with every copy of its
  end; so that end stays open, and out of every child, for the mount's life;
* as root without ``auto_unmount``, ``mount(2)`` with the descriptor in the
  mount data.

Every failure is a :class:`MountFailed` whose message is one line for the user.
Nothing here answers INIT: until the caller does, any access to the mountpoint
blocks, so nothing here touches it after mounting.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import socket
import stat
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Literal

FUSE_DEVICE = "/dev/fuse"
FUSERMOUNT = "fusermount3"
FUSERMOUNT_FALLBACK_PATH = "/usr/bin:/bin"  # where Debian and others install it, for a daemon started with no PATH
COMMFD_ENV = "_FUSE_COMMFD"  # fusermount3 sends the descriptor on the socket this names
FUSERMOUNT_TIMEOUT = 30.0  # seconds fusermount3 has to send the descriptor back
HELPER_EXIT_TIMEOUT = 5.0  # seconds fusermount3 has to exit once it has nothing left to do

# <sys/mount.h>
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOATIME = 1024
MNT_DETACH = 2

_DESCRIPTOR = struct.Struct("i")  # one descriptor in an SCM_RIGHTS message

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.mount.restype = ctypes.c_int
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.umount2.restype = ctypes.c_int


class MountFailed(Exception):
    """Mounting or unmounting failed; the message is one line the daemon can show."""


@dataclass(frozen=True)
class MountOptions:
    """What the kernel mounts: today's ``fsname=rapidmount:BUCKET,subtype=rapidmount,noatime,auto_unmount``."""

    fsname: str  # the mount's source in /proc/self/mountinfo
    subtype: str = "rapidmount"  # the file system type is fuse.<subtype>
    read_only: bool = False
    allow_other: bool = False
    default_permissions: bool = False  # the kernel checks modes, owner and group
    auto_unmount: bool = True  # fusermount3 unmounts when this process dies
    noatime: bool = True
    nosuid: bool = True
    nodev: bool = True


@dataclass(eq=False)
class Mounted:
    """A mount's ``/dev/fuse`` descriptor, and what keeps its auto_unmount armed.

    ``auto_unmount_socket`` is this process's end of fusermount3's socket: closing
    it (or dying) makes the waiting fusermount3, ``auto_unmount_helper``, unmount.
    """

    fd: int
    mounted_by: Literal["mount(2)", "fusermount3"]
    auto_unmount_socket: socket.socket | None = None
    auto_unmount_helper: subprocess.Popen[bytes] | None = None
    unmounted: bool = field(default=False, init=False)
    closed: bool = field(default=False, init=False)

    def close(self) -> None:
        """Close the descriptor, then the auto_unmount socket, and reap fusermount3. Idempotent.

        In that order: fusermount3 unmounts what is still mounted only once it
        finds the connection dead, which needs the descriptor closed (by every
        process that holds a copy). Until then it waits, and is left waiting.
        """
        self._close_descriptor()
        if self.auto_unmount_socket is not None:
            self.auto_unmount_socket.close()
        if self.auto_unmount_helper is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.auto_unmount_helper.wait(HELPER_EXIT_TIMEOUT)

    def _close_descriptor(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


def open_and_mount(mountpoint: str, options: MountOptions, timeout: float = FUSERMOUNT_TIMEOUT) -> Mounted:
    """Mount on ``mountpoint``; the Mounted holds the ``/dev/fuse`` descriptor (close-on-exec).

    Blocks up to ``timeout`` seconds for fusermount3: call it from a thread under trio.
    """
    target = _check_mountpoint(mountpoint)
    if options.auto_unmount or os.geteuid() != 0:
        return _mount_by_fusermount(target, options, timeout)
    return _mount_by_syscall(target, options)


def unmount(mountpoint: str, mounted: Mounted, lazy: bool = True) -> None:
    """Unmount, then close the descriptor and the auto_unmount socket.

    Idempotent: a mount already gone (``fusermount3 -u``, auto_unmount) is no error.
    """
    if not lazy:
        mounted._close_descriptor()  # libfuse: else a synchronous umount could wait on this very server
    try:
        if not mounted.unmounted:
            _unmount(mountpoint, lazy)
            mounted.unmounted = True
    finally:
        mounted.close()


def _check_mountpoint(mountpoint: str) -> str:
    """The real path of ``mountpoint``, or MountFailed why nothing can be mounted there.

    As rapidmount's pre-flight check does: what is mounted there already is
    refused, never unmounted. Like any stat, this one blocks on a FUSE mount
    whose server does not answer.
    """
    try:
        status = os.stat(mountpoint)
    except FileNotFoundError:
        raise MountFailed(f"mountpoint does not exist: {mountpoint}") from None
    except OSError as err:
        if err.errno == errno.ENOTCONN:
            raise MountFailed(f"mountpoint is a FUSE mount whose daemon is gone (Transport endpoint is not "
                              f"connected): unmount it first with fusermount3 -u {mountpoint}") from None
        raise MountFailed(f"cannot access mountpoint {mountpoint}: {err.strerror}") from None
    if not stat.S_ISDIR(status.st_mode):
        raise MountFailed(f"mountpoint is not a directory: {mountpoint}")
    target = os.path.realpath(mountpoint)
    if target in _mount_points():
        raise MountFailed(f"mountpoint is already mounted: {mountpoint}")
    return target


def mount_fusectl(root: str) -> str | None:
    """``mount -t fusectl fusectl ROOT`` by the system call: None once
    mounted, else why not (the daemon's fallback where mount(8) is missing)."""
    if _libc.mount(b"fusectl", os.fsencode(root), b"fusectl", 0, None) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def _mount_by_syscall(target: str, options: MountOptions) -> Mounted:
    try:
        fd = os.open(FUSE_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    except (FileNotFoundError, IsADirectoryError):
        raise MountFailed(f"{FUSE_DEVICE} is missing: install fuse3 and load the fuse module") from None
    except OSError as err:
        raise MountFailed(f"cannot open {FUSE_DEVICE}: {err.strerror}") from None
    data = ",".join([f"fd={fd}", f"rootmode={stat.S_IFDIR:o}", f"user_id={os.getuid()}", f"group_id={os.getgid()}",
                     *_connection_options(options)])
    flags = ((MS_RDONLY if options.read_only else 0) | (MS_NOSUID if options.nosuid else 0)
             | (MS_NODEV if options.nodev else 0) | (MS_NOATIME if options.noatime else 0))
    result = _libc.mount(os.fsencode(options.fsname), os.fsencode(target), f"fuse.{options.subtype}".encode(),
                         flags, data.encode())
    if result != 0:
        code = ctypes.get_errno()
        os.close(fd)
        raise MountFailed(f"cannot mount on {target}: mount(2): {os.strerror(code)}")
    return Mounted(fd, "mount(2)")


def _mount_by_fusermount(target: str, options: MountOptions, timeout: float) -> Mounted:
    program = _fusermount()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: the waiting fusermount3 keeps it
        try:
            with theirs:  # fusermount3 gets its own copy; ours would hide its exit (no EOF)
                helper = subprocess.Popen([program, "-o", _fusermount_options(options), "--", target],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                          pass_fds=[theirs.fileno()],
                                          env={**os.environ, COMMFD_ENV: str(theirs.fileno())})
        except OSError as err:
            ours.close()
            raise MountFailed(f"cannot run {program}: {err.strerror}") from None
        try:
            fd = _receive_descriptor(ours, timeout)
        except BaseException as err:
            ours.close()
            helper.kill()
            helper.wait()
            if isinstance(err, TimeoutError):
                raise MountFailed(f"cannot mount on {target}: {program} sent no {FUSE_DEVICE} descriptor "
                                  f"within {timeout:g} s") from None
            raise
        if fd is None:
            ours.close()
            _reap(helper)
            stderr.seek(0)
            said = _one_line(stderr.read()) or f"{program} exited with status {helper.returncode}"
            raise MountFailed(f"cannot mount on {target}: {said}")
    if not options.auto_unmount:
        ours.close()
        _reap(helper)  # it exits once the descriptor is sent
        return Mounted(fd, "fusermount3")
    return Mounted(fd, "fusermount3", auto_unmount_socket=ours, auto_unmount_helper=helper)


def _receive_descriptor(sock: socket.socket, timeout: float) -> int | None:
    """The descriptor fusermount3 sends, None when it exits without.

    Close-on-exec as it arrives (``socket.recv_fds`` of Python 3.11 drops its
    flags): a process started meanwhile by another thread must not hold the
    connection open.
    """
    sock.settimeout(timeout)
    try:
        _, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_LEN(_DESCRIPTOR.size), socket.MSG_CMSG_CLOEXEC)
    finally:
        sock.settimeout(None)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(data) >= _DESCRIPTOR.size:
            fd: int = _DESCRIPTOR.unpack_from(data)[0]
            return fd
    return None


def _one_line(said: bytes) -> str:
    """What fusermount3 wrote on stderr, as one line for the user."""
    return "; ".join(line.strip() for line in said.decode(errors="replace").splitlines() if line.strip())


def _reap(helper: subprocess.Popen[bytes]) -> None:
    """Wait for fusermount3, which has nothing left to do; kill it if it lingers."""
    try:
        helper.wait(HELPER_EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()


def _unmount(mountpoint: str, lazy: bool) -> None:
    if os.geteuid() == 0:
        if _libc.umount2(os.fsencode(mountpoint), MNT_DETACH if lazy else 0) != 0:
            code = ctypes.get_errno()
            if code not in (errno.EINVAL, errno.ENOENT):  # not mounted (any more)
                raise MountFailed(f"cannot unmount {mountpoint}: {os.strerror(code)}")
        return
    if not _is_mount_point(mountpoint):
        return
    program = _fusermount()
    result = subprocess.run([program, "-u", *(["-z"] if lazy else []), "--", mountpoint],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if result.returncode != 0 and _is_mount_point(mountpoint):
        said = _one_line(result.stderr) or f"{program} exited with status {result.returncode}"
        raise MountFailed(f"cannot unmount {mountpoint}: {said}")


def _fusermount() -> str:
    found = shutil.which(FUSERMOUNT) or shutil.which(FUSERMOUNT, path=FUSERMOUNT_FALLBACK_PATH)
    if found is None:
        raise MountFailed(f"{FUSERMOUNT} is not installed: install the fuse3 package")
    return found


def _fusermount_options(options: MountOptions) -> str:
    """fusermount3's ``-o``; it takes a backslash-escaped comma in fsname and subtype only."""
    flags = ["ro" if options.read_only else "rw", "nosuid" if options.nosuid else "suid",
             "nodev" if options.nodev else "dev", "noatime" if options.noatime else "atime"]
    return ",".join([f"fsname={_escape(options.fsname)}", f"subtype={_escape(options.subtype)}", *flags,
                     *_connection_options(options), *(["auto_unmount"] if options.auto_unmount else [])])


def _connection_options(options: MountOptions) -> list[str]:
    """The options the kernel's FUSE connection itself takes."""
    return [name for name, wanted in (("allow_other", options.allow_other),
                                      ("default_permissions", options.default_permissions)) if wanted]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,")


def _is_mount_point(mountpoint: str) -> bool:
    """Whether something is mounted on ``mountpoint``, without a stat of it (which would reach the mount)."""
    absolute = os.path.abspath(mountpoint)
    return os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute)) in _mount_points()


def _mount_points() -> set[str]:
    with open("/proc/self/mountinfo", "rb") as info:
        return {os.fsdecode(_unescape(fields[4])) for fields in map(bytes.split, info) if len(fields) > 4}


def _unescape(path: bytes) -> bytes:
    """A path as /proc/self/mountinfo writes it, with spaces, tabs, newlines and backslashes in octal."""
    return re.sub(rb"\\([0-7]{3})", lambda match: bytes([int(match.group(1), 8)]), path)
