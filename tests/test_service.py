"""Running as a systemd service: readiness and stop notifications, the unit file."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys


from rapidmount.emulator import Emulator
from tests.mountutil import is_mounted, rapidmount_command, require_fuse, unmount

REPO = pathlib.Path(__file__).resolve().parents[1]
BUCKET = "svc-bucket"


def _receive(sock: socket.socket, timeout: float) -> str:
    sock.settimeout(timeout)
    return sock.recv(4096).decode()


def test_ready_after_mount_and_stop_flushes_writers(tmp_path):
    require_fuse()
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        notify_path = tmp_path / "notify.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify_path))
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        env = dict(os.environ, NOTIFY_SOCKET=str(notify_path))
        process = subprocess.Popen(
            rapidmount_command("--foreground", "--anonymous", "--endpoint", emu.endpoint,
                               "--log-file", str(tmp_path / "log"), BUCKET, str(mnt)),
            env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            ready = _receive(sock, 30)
            assert ready.startswith("READY=1"), ready
            assert is_mounted(str(mnt)) and os.listdir(mnt) == []  # it answers
            # An append in flight: written, neither fsync'd nor closed.
            f = open(mnt / "log.txt", "wb")
            f.write(b"x" * 3_000_000 + b"tail")
            f.flush()  # into the daemon, not to the bucket
            process.send_signal(signal.SIGTERM)
            assert _receive(sock, 30) == "STOPPING=1"
            assert process.wait(timeout=60) == 0, process.stderr.read()
            try:
                f.close()
            except OSError:
                pass  # the mount is gone; the bytes were flushed by the daemon
            assert emu.read_object(BUCKET, "log.txt") == b"x" * 3_000_000 + b"tail"
        finally:
            if process.poll() is None:
                process.kill()
            unmount(str(mnt))
            sock.close()


def test_without_notify_socket_nothing_is_sent(monkeypatch):
    from rapidmount.notify import notify

    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False


def test_unit_file_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: apt-get install systemd"
    unit = (REPO / "systemd" / "rapidmount@.service").read_text()
    rapidmount = pathlib.Path(sys.executable).with_name("rapidmount")
    assert rapidmount.exists()
    unit = unit.replace("/usr/local/bin/rapidmount", str(rapidmount))
    target = tmp_path / "rapidmount@demo-bucket.service"
    target.write_text(unit)
    result = subprocess.run([analyze, "verify", str(target)], capture_output=True, text=True)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 0 and not problems, problems
    assert "Type=notify" in unit and "Restart=on-failure" in unit and "EnvironmentFile=" in unit
