"""Mount rapidmount for real in tests: a daemon process on a temporary mountpoint.

Under ``CI=true`` a mount that cannot happen fails the test; elsewhere (a
developer without root or /dev/fuse) it skips with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import random
import os
import re
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import pytest

MOUNT_TIMEOUT = 30.0
#: Flags every mount of the running test gets: the request loop it runs
#: under (``tests/mount/conftest.py`` sets it per test).
LOOP_FLAGS: tuple[str, ...] = ()


def fuse_available() -> str | None:
    """None if this process can mount FUSE file systems, else why not."""
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as err:
        return f"/dev/fuse: {err.strerror}"
    os.close(fd)
    return None


def require_fuse() -> None:
    reason = fuse_available()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"cannot mount under CI: {reason}")
    pytest.skip(f"cannot mount here: {reason}")


def is_mounted(path: str) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return any(line.split()[4] == real for line in info)


def stop_process(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``: a daemon never outlives its test."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def rapidmount_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rapidmount.daemon.cli", *args]


class Mount:
    def __init__(self, path: pathlib.Path, process: subprocess.Popen, log_path: pathlib.Path) -> None:
        self.path = path
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def worker_pids(self) -> list[int]:
        """The data-plane worker processes of this mount."""
        return worker_pids_of(self.pid)

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks


def worker_pids_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and b"rapidmount.workers.main" in command:
            found.append(int(entry))
    return sorted(found)


def kill_left_behind(workers: list[int]) -> None:
    """SIGKILL the workers a stopped mount left: one a test hung (SIGSTOP) cannot
    see its socket close when the daemon had to be killed (a loaded machine)."""
    for pid in workers:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"rapidmount.workers.main" in cmdline.read():
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            continue  # gone already


def unmount(path: str) -> None:
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", path], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def mounted(endpoint: str, bucket: str, *extra: str, mountpoint: pathlib.Path | None = None,
            anonymous: bool = True, env: dict[str, str] | None = None, log_to_stderr: bool = False):
    """Run ``rapidmount --foreground`` against ``endpoint`` and yield the Mount.

    ``anonymous=False`` leaves out ``--anonymous`` (credentials come from
    ``extra`` or ``env``); ``env`` replaces the daemon's environment.
    ``log_to_stderr``: no ``--log-file``; the daemon's (and its workers')
    stderr goes to a file, which ``Mount.log()`` reads.
    """
    require_fuse()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="rapidmount-test-"))
    path = mountpoint or scratch / "mnt"
    path.mkdir(exist_ok=True)
    log_path = scratch / ("stderr.log" if log_to_stderr else "daemon.log")
    log_flags = () if log_to_stderr else ("--log-file", str(log_path))
    command = rapidmount_command("--foreground", *(("--anonymous",) if anonymous else ()),
                                 "--endpoint", endpoint, *log_flags, "--log-level", "debug",
                                 *_fresh_names(extra), *LOOP_FLAGS, *extra, bucket, str(path))
    stderr = open(log_path, "wb") if log_to_stderr else subprocess.PIPE
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=stderr, env=env)
    finally:
        if log_to_stderr:
            stderr.close()
    mount = Mount(path, process, log_path)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        levels = [extra[i + 1] for i, flag in enumerate(extra[:-1]) if flag == "--log-level"]
        quiet = bool(levels) and levels[-1] in ("warning", "error")  # no "mounted" line to wait for
        while not _ready(mount, quiet):
            if process.poll() is not None:
                stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
                pytest.fail(f"rapidmount exited with {process.returncode}: {stderr}\n{mount.log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"rapidmount did not mount within {MOUNT_TIMEOUT}s\n{mount.log()}")
            time.sleep(0.05)
        _wait_for_workers(mount)
        yield mount
    finally:
        workers = worker_pids_of(process.pid) if process.poll() is None else []
        stop_process(process)
        unmount(str(path))
        kill_left_behind(workers)
        with contextlib.suppress(OSError):
            path.rmdir()


def _wait_for_workers(mount: Mount, limit: float = 15.0) -> None:
    """Until every data-plane worker has opened the bucket: the mount serves
    once the first has, and a later one's start-up calls (GetStorageLayout)
    must not land in a test's count of RPCs. A worker that never starts (a
    fault test) costs at most ``limit``; the test then sees what it sees."""
    counted = re.search(r"; (\d+) data-plane workers?,", mount.log())
    if counted is None:  # not logged at this level
        return
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and mount.process.poll() is None:
        log = mount.log()
        if all(f"data-plane worker {index} started" in log for index in range(int(counted.group(1)))):
            return
        time.sleep(0.05)


def _fresh_names(extra: tuple[str, ...]) -> tuple[str, ...]:
    """``--negative-ttl 0`` unless the test sets it (or uses a config file):
    tests make objects behind the mount's back and use them at once, and a
    listing of the mount made by anything else on the machine (``ls``, a
    file indexer) would otherwise hide new names for the default 5 s."""
    if any(arg.startswith(("--negative-ttl", "--config-file")) or "negative" in arg for arg in extra):
        return ()
    return ("--negative-ttl", "0")


def _ready(mount: Mount, quiet: bool = False) -> bool:
    # The daemon logs "mounted ..." only after a stat through the kernel worked.
    if not is_mounted(str(mount.path)):
        return False
    if quiet:
        return _answers(mount.path)
    return "mounted gs://" in mount.log()


def _answers(path: pathlib.Path) -> bool:
    try:
        os.stat(path)
    except OSError:
        return False
    return True


def stop_and_wait_unmounted(path: str, pattern: str, timeout: float = 20.0) -> bool:
    """SIGTERM the daemons whose command line matches ``pattern``; wait for the
    mount to go; then make sure it is gone. Returns whether it went by itself."""
    subprocess.run(["pkill", "-TERM", "-f", pattern])
    deadline = time.monotonic() + timeout
    while is_mounted(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    went = not is_mounted(path)
    unmount(path)
    return went


def after_release(check, timeout: float = 5.0) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds passed; its last result.

    The kernel sends a file's last RELEASE after close() returned, and a
    truncation alone (``O_TRUNC`` or ``ftruncate``, nothing written after it)
    reaches the bucket there: a test waits for it with this."""
    deadline = time.monotonic() + timeout
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return result


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        assert written > 0, "write() returned 0"
        view = view[written:]


class HangGuard:
    """Fail a test that runs too long instead of hanging the suite.

    Mounts made through :meth:`mount` are killed once the limit passes, which
    fails pending syscalls on them with ENOTCONN.
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._live: list[Mount] = []

    @contextlib.contextmanager
    def mount(self, emulator, bucket: str, *flags: str, **options):
        """``mounted`` on ``emulator`` (or an endpoint string), killed past the limit."""
        endpoint = emulator if isinstance(emulator, str) else emulator.endpoint
        with mounted(endpoint, bucket, *flags, **options) as m:
            self._live.append(m)
            try:
                yield m
            finally:
                self._live.remove(m)

    def autouse_fixture(self):
        """An autouse fixture arming the guard around every test of a module."""

        @pytest.fixture(autouse=True)
        def hang_guard():
            with self.armed():
                yield

        return hang_guard

    @contextlib.contextmanager
    def armed(self):
        import threading

        fired = threading.Event()

        def fire() -> None:
            fired.set()
            for m in list(self._live):
                if m.process.poll() is None:
                    m.process.kill()

        timer = threading.Timer(self.limit, fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
        if fired.is_set():
            pytest.fail(f"the test ran over {self.limit:.0f}s (hung?); its daemons were killed")


# -- shared by the mount tests -------------------------------------------------------------------

def payload(size: int, seed: int) -> bytes:
    """Reproducible random bytes."""
    return random.Random(seed).randbytes(size)


def errno_name(code: int | None) -> str:
    return "success" if code is None else errno.errorcode.get(code, str(code))


def errno_of(action) -> int | None:
    """The errno ``action()`` fails with, None if it succeeds."""
    try:
        action()
    except OSError as err:
        return err.errno
    return None


def assert_errno(action, expected: int, what: str) -> None:
    got = errno_of(action)
    assert got == expected, f"{what}: expected {errno_name(expected)}, got {errno_name(got)}"
