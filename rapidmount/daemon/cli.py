"""``rapidmount [options] BUCKET MOUNTPOINT``: check, connect, mount, serve.

Every failure a user can cause ends as one line on stderr and a non-zero
exit status (see ``EXIT_*``), never a traceback. Without ``--foreground``
the process forks before any thread starts; the parent waits until the
child's mount is live (exit 0) or the child reports why it failed (and
exits with the child's status).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from rapidmount import __version__
from rapidmount.shared import logs
from rapidmount.daemon.config import ConfigError, add_flags, config_from_args, effective_toml
from rapidmount.shared.exits import EXIT_CANNOT_MOUNT, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, MountError

__all__ = ["EXIT_CANNOT_MOUNT", "EXIT_OK", "EXIT_RUNTIME", "EXIT_USAGE", "MountError", "main"]

log = logging.getLogger("rapidmount")

class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage + error; we print one line
        sys.stderr.write(f"rapidmount: error: {message} (see rapidmount --help)\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="rapidmount",
        description="Mount a Google Cloud Storage bucket (Rapid/zonal buckets over bidi gRPC streams).",
        epilog="Try it without a cloud account: rapidmount --emulator demo-bucket /mnt/demo")
    parser.add_argument("bucket", metavar="BUCKET")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT")
    parser.add_argument("-o", dest="options", action="append", metavar="OPTIONS",
                        help="mount options: ro, rw, allow_other (the kernel then checks modes, owner and group), "
                             "default_permissions, or FLAG=VALUE")
    parser.add_argument("--config-file", default=None, metavar="PATH",
                        help="read flags from a TOML file (keys are flag names); flags and -o options given here "
                             "override it")
    parser.add_argument("--version", action="version", version=f"rapidmount {__version__}")
    parser.add_argument("--print-config", action="store_true",
                        help="print the settings in force as TOML (each with where it came from: default, "
                             "profile, config file, flag or -o) and exit without mounting")
    add_flags(parser)
    return parser


# -- pre-flight checks -----------------------------------------------------------------------------

def _mounted_paths() -> set[str]:
    paths = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                fields = line.split()
                if len(fields) > 4:
                    paths.add(fields[4].replace("\\040", " "))
    except OSError:
        pass
    return paths


def check_mountpoint(path: str) -> str:
    real = os.path.realpath(path)
    if not os.path.exists(path):
        raise MountError(f"mountpoint does not exist: {path}")
    if not os.path.isdir(path):
        raise MountError(f"mountpoint is not a directory: {path}")
    if real in _mounted_paths():
        raise MountError(f"mountpoint is already mounted: {path}")
    return real


def lock_mountpoint(path: str) -> int:
    """Hold an exclusive lock on the directory we mount over, for the daemon's life.

    The "already mounted" check cannot see a mount that another rapidmount
    is still setting up; the lock can. The descriptor survives the fork.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise MountError(f"mountpoint is in use by another rapidmount: {path}") from None
    return fd


def check_fuse_device(path: str = "/dev/fuse") -> None:
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise MountError(f"{path} is missing: install fuse3 and load the fuse module") from None
    except PermissionError:
        raise MountError(f"no permission to open {path}: run as root or grant access to it") from None
    except OSError as err:
        raise MountError(f"cannot open {path}: {err.strerror}") from None
    os.close(fd)


# -- daemonizing -----------------------------------------------------------------------------------

def _daemonize() -> Callable[..., None]:
    """Fork; the parent exits with the child's verdict. Returns ``report``.

    The child calls ``report(None)`` once the mount is live, or
    ``report(message, exit_code)`` when it failed.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(write_fd)
        chunks = []
        while chunk := os.read(read_fd, 4096):
            chunks.append(chunk)
        verdict = b"".join(chunks).decode(errors="replace").strip()
        if verdict == "ok":
            os._exit(EXIT_OK)
        code, _, message = verdict.partition(" ")
        if not code.isdigit():
            _, status = os.waitpid(pid, 0)
            code, message = str(EXIT_RUNTIME), \
                f"the mount process exited early (status {os.waitstatus_to_exitcode(status)})"
        sys.stderr.write(f"rapidmount: error: {message}\n")
        os._exit(int(code))
    os.close(read_fd)
    os.setsid()

    def report(error: str | None, exit_code: int = EXIT_RUNTIME) -> None:
        nonlocal write_fd
        if write_fd < 0:
            return
        try:
            os.write(write_fd, b"ok\n" if error is None else f"{exit_code} {error}\n".encode())
        finally:
            os.close(write_fd)
            write_fd = -1
        if error is None:
            # Detach from the terminal only once the parent has its answer.
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.close(null)

    return report


def main(argv: list[str] | None = None) -> int:
    # libfuse forks fusermount3 (for auto_unmount) from a process running gRPC
    # threads; the child only execs, so gRPC's fork handlers are not wanted.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    # gRPC's own log lines (e.g. each failed TLS handshake) would bypass ours.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as err:
        sys.stderr.write(f"rapidmount: error: {err}\n")
        return EXIT_USAGE
    if args.print_config:
        sys.stdout.write(effective_toml(config))
        return EXIT_OK
    try:
        logs.setup(config.log_level, config.log_file, config.foreground, config.log_format)
    except OSError as err:
        sys.stderr.write(f"rapidmount: error: --log-file: cannot open {config.log_file}: {err.strerror}\n")
        return EXIT_USAGE
    # Until the mount serves (and trio takes the signal over), SIGHUP must not kill us.
    signal.signal(signal.SIGHUP, lambda signum, frame: logs.reopen())
    try:
        config = dataclasses.replace(config, mountpoint=check_mountpoint(config.mountpoint))
        check_fuse_device()
        lock_mountpoint(config.mountpoint)  # held (open) until the process exits
    except MountError as err:
        sys.stderr.write(f"rapidmount: error: {err}\n")
        return err.exit_code

    report: Callable[..., None] = lambda error, exit_code=EXIT_RUNTIME: None
    if not config.foreground:
        report = _daemonize()

    from rapidmount.daemon.serve import run_mount  # heavy imports after the fork

    try:
        run_mount(config, on_ready=lambda: report(None))
    except MountError as err:
        if config.log_file:  # on stderr, the line below says it already
            log.error("%s", err)
        report(str(err), err.exit_code)
        if config.foreground:
            sys.stderr.write(f"rapidmount: error: {err}\n")
        return err.exit_code
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as err:  # a bug: the traceback goes to the debug log, the user gets one line
        log.error("internal error: %r", err, exc_info=True)
        report(f"internal error: {err!r}", EXIT_RUNTIME)
        if config.foreground:
            sys.stderr.write(f"rapidmount: error: internal error: {err!r}\n")
        return EXIT_RUNTIME
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
