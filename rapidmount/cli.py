"""``rapidmount [options] BUCKET MOUNTPOINT``: check, connect, mount, serve.

Every failure a user can cause ends as one line on stderr and a non-zero
exit status, never a traceback. Without ``--foreground`` the process forks
before any thread starts; the parent waits until the child's mount is live
(exit 0) or the child reports why it failed (exit 1).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from rapidmount import __version__
from rapidmount.config import ConfigError, add_flags, config_from_args

log = logging.getLogger("rapidmount")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class MountError(Exception):
    """A failure to report as one line, e.g. 'bucket "x" does not exist'."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error; we print one line
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
                        help="mount options: ro, rw, allow_other, default_permissions, or FLAG=VALUE")
    parser.add_argument("--config-file", default=None, metavar="PATH",
                        help="read flags from a TOML file (keys are flag names); flags given here override it")
    parser.add_argument("--version", action="version", version=f"rapidmount {__version__}")
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


# -- logging ---------------------------------------------------------------------------------------

def setup_logging(level: str, log_file: str | None, foreground: bool) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if log_file:
        handler: logging.Handler = logging.FileHandler(log_file)
    elif foreground:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.NullHandler()
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # grpc and google libraries are chatty at INFO.
    for noisy in ("grpc", "google", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


# -- daemonizing -----------------------------------------------------------------------------------

def _daemonize() -> Callable[[str | None], None]:
    """Fork; the parent exits with the child's verdict. Returns ``report``.

    The child calls ``report(None)`` once the mount is live, or
    ``report(message)`` when it failed.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(write_fd)
        chunks = []
        while chunk := os.read(read_fd, 4096):
            chunks.append(chunk)
        message = b"".join(chunks).decode(errors="replace").strip()
        if message == "ok":
            os._exit(EXIT_OK)
        if not message:
            _, status = os.waitpid(pid, 0)
            message = f"the mount process exited early (status {os.waitstatus_to_exitcode(status)})"
        sys.stderr.write(f"rapidmount: error: {message}\n")
        os._exit(EXIT_FAILURE)
    os.close(read_fd)
    os.setsid()

    def report(error: str | None) -> None:
        nonlocal write_fd
        if write_fd < 0:
            return
        try:
            os.write(write_fd, b"ok\n" if error is None else error.encode() + b"\n")
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
    setup_logging(config.log_level, config.log_file, config.foreground)
    try:
        config.mountpoint = check_mountpoint(config.mountpoint)
        check_fuse_device()
    except MountError as err:
        sys.stderr.write(f"rapidmount: error: {err}\n")
        return EXIT_FAILURE

    report: Callable[[str | None], None] = lambda error: None
    if not config.foreground:
        report = _daemonize()

    from rapidmount.daemon import run_mount  # heavy imports after the fork

    try:
        run_mount(config, on_ready=lambda: report(None))
    except MountError as err:
        report(str(err))
        if config.foreground:
            sys.stderr.write(f"rapidmount: error: {err}\n")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as err:  # a bug: log it fully, tell the user one line
        log.exception("rapidmount failed")
        report(f"internal error: {err!r}")
        if config.foreground:
            sys.stderr.write(f"rapidmount: error: internal error: {err!r}\n")
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    # Run the imported module's main: under ``python -m`` this file is
    # ``__main__``, and the daemon's MountError must be the class main() catches.
    from rapidmount.cli import main as imported_main

    raise SystemExit(imported_main())
