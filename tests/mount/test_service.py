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

REPO = pathlib.Path(__file__).resolve().parents[2]
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


def _unit() -> dict[str, list[str]]:
    """The unit's settings: key -> every value given (comments and sections dropped)."""
    settings: dict[str, list[str]] = {}
    for line in (REPO / "systemd" / "rapidmount@.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _exec_start(env_file: pathlib.Path, instance: str) -> list[str]:
    """ExecStart as systemd expands it: %i, ${VAR} as one word, $VAR split on whitespace."""
    env = {}
    for line in env_file.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    words = []
    for word in _unit()["ExecStart"][0].split():
        if word.startswith("${"):
            words.append(env[word[2:-1]])
        elif word.startswith("$"):
            words.extend(env.get(word[1:], "").split())
        else:
            words.append(word.replace("%i", instance))
    assert words[0] == "/usr/local/bin/rapidmount"
    return rapidmount_command(*words[1:])


def test_unit_runs_from_its_env_file_and_stop_flushes_every_writer(tmp_path):
    """ExecStart with the env file's MOUNTPOINT and options, under a local
    NOTIFY_SOCKET: READY=1 once the mount answers; SIGTERM with appends and a
    staged rewrite in flight flushes them all, unmounts, and exits 0."""
    require_fuse()
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        emu.seed(BUCKET, "existing.txt", b"0123456789")
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        env_file = tmp_path / f"{BUCKET}.env"
        env_file.write_text(f"# as in /etc/rapidmount/{BUCKET}.env\nMOUNTPOINT={mnt}\n"
                            f"RAPIDMOUNT_OPTIONS=--anonymous --endpoint {emu.endpoint} -o file_mode=0600 "
                            f"--log-file {tmp_path / 'log'} --log-format json\n")
        notify_path = tmp_path / "notify.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify_path))
        process = subprocess.Popen(_exec_start(env_file, BUCKET), env=dict(os.environ, NOTIFY_SOCKET=str(notify_path)),
                                   stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        files = []
        try:
            ready = _receive(sock, 30)
            assert ready.startswith("READY=1") and f"gs://{BUCKET} on {mnt}" in ready, ready
            # READY=1 comes only once the kernel mount answers: no waiting here.
            assert is_mounted(str(mnt)) and os.stat(mnt / "existing.txt").st_mode & 0o777 == 0o600
            expected = {}
            for index in range(3):
                name = f"append-{index}.log"
                f = open(mnt / name, "wb")
                f.write(bytes([65 + index]) * (1_000_000 * (index + 1)) + b"end")
                f.flush()  # into the daemon, not yet to the bucket
                files.append(f)
                expected[name] = bytes([65 + index]) * (1_000_000 * (index + 1)) + b"end"
            staged = open(mnt / "existing.txt", "r+b")
            staged.seek(4)
            staged.write(b"XY")  # not an append: staged locally until close
            staged.flush()
            files.append(staged)
            expected["existing.txt"] = b"0123XY6789"
            process.send_signal(signal.SIGTERM)
            assert _receive(sock, 30) == "STOPPING=1"
            assert process.wait(timeout=60) == 0, process.stderr.read()
            assert not is_mounted(str(mnt))
            for name, data in expected.items():
                assert emu.read_object(BUCKET, name) == data, name
        finally:
            for f in files:
                try:
                    f.close()
                except OSError:
                    pass  # the mount is gone; the daemon flushed the bytes
            if process.poll() is None:
                process.kill()
            unmount(str(mnt))
            sock.close()


def test_unit_hardening_keeps_the_mount_visible_to_the_host():
    unit = _unit()
    assert unit["Type"] == ["notify"] and unit["Restart"] == ["on-failure"]
    assert unit["EnvironmentFile"] == ["/etc/rapidmount/%i.env"]
    assert "${MOUNTPOINT}" in unit["ExecStart"][0] and "$RAPIDMOUNT_OPTIONS" in unit["ExecStart"][0]
    assert unit["KillSignal"] == ["SIGTERM"] and unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    from rapidmount.daemon.cli import EXIT_USAGE

    assert unit["RestartPreventExitStatus"] == [str(EXIT_USAGE)]
    assert unit["NoNewPrivileges"] == ["yes"] and unit["DeviceAllow"] == ["/dev/fuse rw"]
    assert "CAP_SYS_ADMIN" in unit["CapabilityBoundingSet"][0]
    # Each of these gives the service its own mount namespace, hiding the mount from the host.
    namespacing = {"PrivateTmp", "PrivateMounts", "PrivateDevices", "ProtectSystem", "ProtectKernelTunables",
                   "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectProc",
                   "ReadOnlyPaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "MountFlags"}
    assert not namespacing & unit.keys(), namespacing & unit.keys()
    assert unit.get("ProtectHome", ["no"]) == ["no"]


def test_env_file_example_holds_valid_flags():
    from rapidmount.daemon import cli, config

    command = _exec_start(REPO / "systemd" / "rapidmount.env.example", "my-bucket")
    module_at = command.index("rapidmount.daemon.cli")
    parsed = config.config_from_args(cli.build_parser().parse_args(command[module_at + 1:]))
    assert parsed.mountpoint == "/mnt/data" and parsed.bucket == "my-bucket" and parsed.foreground
    assert parsed.log_format == "json" and parsed.prometheus_port == 9101 and parsed.metadata_ttl == -1


def test_without_notify_socket_nothing_is_sent(monkeypatch):
    from rapidmount.daemon.notify import notify

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
