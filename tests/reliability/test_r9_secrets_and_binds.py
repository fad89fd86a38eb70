"""R9: no secret in any log, and what listens where.

Secrets: the mount runs with real credentials (a service-account key, or a
refresh token through GOOGLE_APPLICATION_CREDENTIALS) against the local
token server, over TLS, at every ``--log-level`` and in both formats, to a
log file or to stderr. It reads, appends, refreshes its token, meets a
revoked token, a token endpoint that refuses, and an error; then every log
and stderr (the daemon's and its workers', which write to the same places)
is searched for every access token issued, the refresh token, the client
secret and each line of the private key: none may appear. Short: every
level once, the formats alternating; soak: every level in both formats,
each to a file and to stderr (``RAPIDMOUNT_R9_RUNS`` takes the first N).

Binds: the emulator CLI and the daemon's metrics endpoint listen on
loopback unless told otherwise (``--host``, ``--prometheus-address``), and
then exactly where told; the data-plane workers listen nowhere. Read from
/proc: the process's socket descriptors matched against /proc/net/tcp and
tcp6.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import socket
import subprocess
import sys
import time

import pytest

from rapidmount.emulator import Emulator
from tests.authutil import (LocalAuthServer, SeenTokens, clean_env, make_tls_pair, refresh_token_info, secret_lines,
                            trusted_key_file)
from tests.mountutil import HangGuard
from tests.reliability.conftest import size

MiB = 1 << 20
BUCKET = "r9-bucket"
LEVELS = ("debug", "info", "warning", "error")

guard = HangGuard(240)
hang_guard = guard.autouse_fixture()


def _runs() -> list[tuple[str, str, bool]]:
    """(level, format, to stderr): short, every level once; soak, every combination."""
    every = [(level, fmt, to_stderr) for level in LEVELS for fmt in ("text", "json") for to_stderr in (False, True)]
    short = [("debug", "text", False), ("info", "json", True), ("warning", "text", True), ("error", "json", False)]
    count = size(len(short), len(every), env="RAPIDMOUNT_R9_RUNS")
    return (every if count > len(short) else short)[:count]


def _fragments(secret: str) -> list[str]:
    """The secret and its two halves' ends: a cut-off secret in a log is a leak too."""
    body = secret.split("-", 1)[-1] if secret.startswith("ya29.") else secret
    return [secret, body[:16], body[-16:]] if len(body) >= 32 else [secret]


def _exercise(m, emu: Emulator, token_server: LocalAuthServer, rng: random.Random) -> None:
    """Reads, appends, a refresh after a revoked token, errors: every path that handles tokens."""
    data = rng.randbytes(8 * MiB)
    emu.seed(BUCKET, "data/read.bin", data)
    with open(m.path / "data" / "read.bin", "rb", buffering=0) as held, \
            open(m.path / "appended.log", "ab", buffering=0) as log:
        first = held.read(MiB)
        log.write(rng.randbytes(MiB))
        os.fsync(log.fileno())
        for token in token_server.issued_tokens():  # a revocation: a forced refresh, mid-read and mid-append
            emu.revoke_token(token)
        log.write(rng.randbytes(MiB))
        os.fsync(log.fileno())
        assert first + held.read() == data
    with pytest.raises(FileNotFoundError):
        os.stat(m.path / "data" / "absent")
    token_server.refuse("invalid_grant")  # the endpoint refuses: one warning, one EACCES
    for token in token_server.issued_tokens():
        emu.revoke_token(token)
    with pytest.raises(PermissionError):
        os.stat(m.path / "other" / "name")
    token_server.refuse(None)
    deadline = time.monotonic() + 20
    while True:  # recovered: the next refresh is allowed a second later
        try:
            os.stat(m.path / "other" / "name")
        except FileNotFoundError:
            break
        except PermissionError:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_r9_no_token_refresh_token_or_key_in_any_log_at_any_level(tmp_path, report):
    runs = _runs()
    rng = random.Random(9)
    cert, tls_key = make_tls_pair()
    (tmp_path / "ca.pem").write_bytes(cert)
    leaks: list[str] = []
    searched = 0
    lines_searched = 0
    with LocalAuthServer() as token_server:
        with Emulator(buckets={BUCKET: "zonal"}, tls_cert=cert, tls_key=tls_key,
                      token_validator=SeenTokens(token_server)) as emu:
            key, key_path = trusted_key_file(token_server, tmp_path)
            refresh_token = token_server.add_refresh_token()
            adc = refresh_token_info(token_server.token_uri, refresh_token)
            (tmp_path / "adc.json").write_text(json.dumps(adc))
            for index, (level, fmt, to_stderr) in enumerate(runs):
                if index % 2 == 0:
                    credentials, env = ("--key-file", key_path), clean_env(tmp_path)
                else:
                    credentials, env = (), clean_env(tmp_path, GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "adc.json"))
                with guard.mount(emu, BUCKET, "--ca-file", str(tmp_path / "ca.pem"), *credentials,
                                 "--log-level", level, "--log-format", fmt, "--workers", "2",
                                 "--cache-size", "16MiB", "--readahead-max", "4MiB",
                                 anonymous=False, env=env, log_to_stderr=to_stderr) as m:
                    _exercise(m, emu, token_server, rng)
                    emu.set_token_validator(SeenTokens(token_server))
                outputs = [m.log()] + ([] if to_stderr else [m.process.stderr.read().decode(errors="replace")])
                if level == "debug":
                    assert "refreshing it" in outputs[0], "the forced refresh was not logged"
                secrets = [*token_server.issued_tokens(), refresh_token, adc["client_secret"],
                           *secret_lines(key.private_pem)]
                for output in outputs:
                    searched += 1
                    lines_searched += output.count("\n")
                    leaks += [f"{level}/{fmt}{'/stderr' if to_stderr else ''}: {fragment[:6]}..."
                              for secret in secrets for fragment in _fragments(secret) if fragment in output]
            issued = len(token_server.issued_tokens())
    report("R9", f"secrets in logs: {len(runs)} mounts ({', '.join(f'{l}/{f}' + ('/stderr' if s else '') for l, f, s in runs)}), "
                 f"{issued} access tokens issued, {searched} logs and stderr searched ({lines_searched} lines) for them, "
                 f"the refresh token, the client secret and the key: {len(leaks)} found")
    assert not leaks, leaks


# -- what listens where --------------------------------------------------------------------------------------


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/{pid}/net/{table}") as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                # The kernel prints each 32-bit word in host (little-endian) order.
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
                ip = ipaddress.ip_address(raw)
                ip = getattr(ip, "ipv4_mapped", None) or ip  # a v4-mapped address is the IPv4 one
                found.add((str(ip), int(port, 16)))
    return found


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


@contextlib.contextmanager
def _emulator_cli(*flags: str):
    process = subprocess.Popen([sys.executable, "-m", "rapidmount.emulator", "--bucket", BUCKET, *flags],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("listening on "), line + process.stderr.read()
        yield process, line.split()[-1]
    finally:
        process.terminate()
        process.wait(10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_r9_the_emulator_and_the_metrics_endpoint_listen_on_loopback_unless_told(report):
    seen = {}
    with _emulator_cli() as (process, endpoint):
        seen["emulator"] = _listening(process.pid)
    with _emulator_cli("--host", "0.0.0.0") as (process, _):
        seen["emulator --host 0.0.0.0"] = _listening(process.pid)
    with _emulator_cli("--host", "::1") as (process, _):
        seen["emulator --host ::1"] = _listening(process.pid)
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        port = _free_port()
        with guard.mount(emu, BUCKET, "--prometheus-port", str(port), "--workers", "2") as m:
            seen["metrics"] = _listening(m.pid)
            seen["workers"] = set().union(*(_listening(pid) for pid in m.worker_pids()))
            assert len(m.worker_pids()) == 2
        port_any = _free_port()
        with guard.mount(emu, BUCKET, "--prometheus-port", str(port_any), "--prometheus-address", "0.0.0.0") as m:
            seen["metrics --prometheus-address 0.0.0.0"] = _listening(m.pid)
    report("R9", "listening sockets: " + "; ".join(
        f"{what} {', '.join(f'{a}:{p}' for a, p in sorted(found)) or 'none'}" for what, found in seen.items()))
    emulator_port = int(endpoint.rpartition(":")[2])
    assert seen["emulator"] == {("127.0.0.1", emulator_port)}
    # Every interface: gRPC makes one dual-stack socket for it.
    assert [address for address, _ in seen["emulator --host 0.0.0.0"]] in (["0.0.0.0"], ["::"])
    assert [address for address, _ in seen["emulator --host ::1"]] == ["::1"]
    assert seen["metrics"] == {("127.0.0.1", port)}
    assert seen["workers"] == set()
    assert seen["metrics --prometheus-address 0.0.0.0"] == {("0.0.0.0", port_any)}
    assert all(_is_loopback(address) for what, found in seen.items() if "0.0.0.0" not in what
               for address, _ in found)
