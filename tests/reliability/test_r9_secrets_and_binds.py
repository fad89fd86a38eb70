"""R9: no secret in any log, and what listens where.

Secrets: the mount runs with real credentials (a service-account key, or a
refresh token through GOOGLE_APPLICATION_CREDENTIALS) against a local
token server, over TLS, at every ``--log-level`` and in both formats, to a
log file or to stderr; several mounts at once, on one emulator. It reads, appends, refreshes its token, meets a
revoked token, a token endpoint that refuses, and an error; then every log
and stderr (the daemon's and its workers', which write to the same places)
is searched for every access token issued, the refresh tokens, the client
secrets and each line of the private key: none may appear. Short: every
level once, the formats alternating; soak: every level in both formats,
each to a file and to stderr (``RAPIDMOUNT_R9_RUNS`` takes the first N).

Binds: the emulator CLI and the daemon's metrics endpoint listen on
loopback unless told otherwise (``--host``, ``--prometheus-address``), and
then exactly where told; the data-plane workers listen nowhere (the
metrics endpoint and workers are those of the secrets check's mounts). Read from
/proc: the process's socket descriptors matched against /proc/net/tcp and
tcp6.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from rapidmount.emulator import Emulator
from tests.authutil import (LocalAuthServer, ServiceAccountKey, clean_env, make_service_account_key, make_tls_pair,
                            refresh_token_info, secret_lines)
from tests.mountutil import HangGuard
from tests.reliability.conftest import retry_eacces, size

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


def _exercise(m, emu: Emulator, token_server: LocalAuthServer, rng: random.Random, prefix: str) -> None:
    """Reads, appends, a refresh after a revoked token, errors: every path that handles tokens."""
    data = rng.randbytes(8 * MiB)
    emu.seed(BUCKET, f"{prefix}/data/read.bin", data)
    root = m.path / prefix
    with open(root / "data" / "read.bin", "rb", buffering=0) as held, \
            open(root / "appended.log", "ab", buffering=0) as log:
        first = held.read(MiB)
        log.write(rng.randbytes(MiB))
        os.fsync(log.fileno())
        for token in token_server.issued_tokens():  # a revocation: a forced refresh, mid-read and mid-append
            emu.revoke_token(token)
        log.write(rng.randbytes(MiB))
        os.fsync(log.fileno())
        assert first + held.read() == data
    with pytest.raises(FileNotFoundError):
        os.stat(root / "data" / "absent")
    token_server.refuse("invalid_grant")  # the endpoint refuses: one warning, one EACCES
    for token in token_server.issued_tokens():
        emu.revoke_token(token)
    with pytest.raises(PermissionError):
        os.stat(root / "other" / "name")
    token_server.refuse(None)
    with pytest.raises(FileNotFoundError):  # recovered: the next refresh is allowed a second later
        retry_eacces(lambda: os.stat(root / "other" / "name"))


@dataclass
class Run:
    """One mount of the secrets check, and what it left."""
    level: str
    fmt: str
    to_stderr: bool
    metrics_port: int
    metrics_told: str | None  # --prometheus-address, if given
    outputs: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # the refresh token and client secret it used
    metrics: set[tuple[str, int]] = field(default_factory=set)  # where the daemon listens
    workers: set[tuple[str, int]] = field(default_factory=set)  # where its two workers listen

    @property
    def name(self) -> str:
        return f"{self.level}/{self.fmt}" + ("/stderr" if self.to_stderr else "")


def _mount_and_exercise(run: Run, index: int, emu: Emulator, token_server: LocalAuthServer,
                        key: ServiceAccountKey, tmp_path) -> None:
    """Key file (even runs) or refresh token (odd runs), against this run's own token server."""
    run_dir = tmp_path / f"run-{index}"
    run_dir.mkdir()
    token_server.trust_key(key)
    if index % 2 == 0:
        key_path = ServiceAccountKey(dict(key.info, token_uri=token_server.token_uri), key.private_pem,
                                     key.public_pem).write(run_dir / "key.json")
        credentials, env = ("--key-file", key_path), clean_env(run_dir)
    else:
        adc = refresh_token_info(token_server.token_uri, token_server.add_refresh_token())
        run.secrets += [adc["refresh_token"], adc["client_secret"]]
        (run_dir / "adc.json").write_text(json.dumps(adc))
        credentials, env = (), clean_env(run_dir, GOOGLE_APPLICATION_CREDENTIALS=str(run_dir / "adc.json"))
    metrics = ("--prometheus-port", str(run.metrics_port))
    if run.metrics_told:
        metrics += ("--prometheus-address", run.metrics_told)
    with guard.mount(emu, BUCKET, "--ca-file", str(tmp_path / "ca.pem"), *credentials, *metrics,
                     "--log-level", run.level, "--log-format", run.fmt, "--workers", "2",
                     "--cache-size", "16MiB", "--readahead-max", "4MiB",
                     anonymous=False, env=env, log_to_stderr=run.to_stderr) as m:
        _exercise(m, emu, token_server, random.Random(index), f"run-{index}")
        run.metrics = _listening(m.pid)
        deadline = time.monotonic() + 30
        while len(workers := m.worker_pids()) < 2:  # one started while tokens were refused comes back later
            assert time.monotonic() < deadline, f"{run.name}: {len(workers)} data-plane workers"
            time.sleep(0.05)
        run.workers = set().union(*(_listening(pid) for pid in workers))
    run.outputs = [m.log()] + ([] if run.to_stderr else [m.process.stderr.read().decode(errors="replace")])


#: Mounts at once: most of a run waits for the next refresh a refusal allows.
PARALLEL_RUNS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of the secrets check: (runs, every secret any of them had).

    The mounts run side by side on one emulator over TLS, each with a token
    server of its own (a refusal or revocation is then its own) and a metrics
    endpoint: the second told to listen on every interface, the others not."""
    tmp_path = tmp_path_factory.mktemp("r9")
    plan = _runs()
    ports = _free_ports(len(plan))
    runs = [Run(level, fmt, to_stderr, port, "0.0.0.0" if index == 1 else None)
            for index, ((level, fmt, to_stderr), port) in enumerate(zip(plan, ports))]
    cert, tls_key = make_tls_pair()
    (tmp_path / "ca.pem").write_bytes(cert)
    key = make_service_account_key("unused")  # each run's copy names its token server
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(LocalAuthServer()) for _ in runs]
        emu = stack.enter_context(Emulator(
            buckets={BUCKET: "zonal"}, tls_cert=cert, tls_key=tls_key,
            token_validator=lambda token: any(server.token_is_valid(token) for server in servers)))
        stack.enter_context(guard.armed())
        with concurrent.futures.ThreadPoolExecutor(PARALLEL_RUNS) as pool:
            for done in [pool.submit(_mount_and_exercise, run, index, emu, server, key, tmp_path)
                         for index, (run, server) in enumerate(zip(runs, servers))]:
                done.result()
        secrets = [*(token for server in servers for token in server.issued_tokens()),
                   *(secret for run in runs for secret in run.secrets), *secret_lines(key.private_pem)]
    return runs, secrets


def test_r9_no_token_refresh_token_or_key_in_any_log_at_any_level(runs, report):
    runs, secrets = runs
    leaks = [f"{run.name}: {fragment[:6]}..." for run in runs for output in run.outputs
             for secret in secrets for fragment in _fragments(secret) if fragment in output]
    outputs = [output for run in runs for output in run.outputs]
    tokens = sum(secret.startswith("ya29.") for secret in secrets)
    report("R9", f"secrets in logs: {len(runs)} mounts ({', '.join(run.name for run in runs)}), "
                 f"{tokens} access tokens issued, {len(outputs)} logs and stderr searched "
                 f"({sum(output.count(chr(10)) for output in outputs)} lines) for them, "
                 f"the refresh tokens, the client secrets and the key: {len(leaks)} found")
    for run in runs:
        if run.level == "debug":
            assert "refreshing it" in run.outputs[0], f"{run.name}: the forced refresh was not logged"
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


def _free_ports(count: int) -> list[int]:
    """Ports free now, and distinct: each is held until all are chosen."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def test_r9_the_emulator_and_the_metrics_endpoint_listen_on_loopback_unless_told(runs, report):
    runs, _ = runs
    seen = {}
    with contextlib.ExitStack() as stack:  # started together: most of each is Python starting
        emulators = {what: stack.enter_context(_emulator_cli(*flags)) for what, flags in (
            ("emulator", ()), ("emulator --host 0.0.0.0", ("--host", "0.0.0.0")),
            ("emulator --host ::1", ("--host", "::1")))}
        for what, (process, _) in emulators.items():
            seen[what] = _listening(process.pid)
    for run in runs:
        told = f" --prometheus-address {run.metrics_told}" if run.metrics_told else ""
        seen[f"metrics ({run.name}){told}"] = run.metrics
    seen[f"workers of the {len(runs)} mounts"] = set().union(*(run.workers for run in runs))
    report("R9", "listening sockets: " + "; ".join(
        f"{what} {', '.join(f'{a}:{p}' for a, p in sorted(found)) or 'none'}" for what, found in seen.items()))
    emulator_port = int(emulators["emulator"][1].rpartition(":")[2])
    assert seen["emulator"] == {("127.0.0.1", emulator_port)}
    # Every interface: gRPC makes one dual-stack socket for it.
    assert [address for address, _ in seen["emulator --host 0.0.0.0"]] in (["0.0.0.0"], ["::"])
    assert [address for address, _ in seen["emulator --host ::1"]] == ["::1"]
    # Both cases, unless RAPIDMOUNT_R9_RUNS=1 left a single run.
    assert not runs[0].metrics_told and (len(runs) == 1 or runs[1].metrics_told)
    for run in runs:
        assert run.metrics == {(run.metrics_told or "127.0.0.1", run.metrics_port)}, run.name
        assert run.workers == set(), run.name
    assert all(_is_loopback(address) for what, found in seen.items() if "0.0.0.0" not in what
               for address, _ in found)
