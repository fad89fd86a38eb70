"""R7: an access token revoked before it expires.

The service answers UNAUTHENTICATED to every call, and ends every open
stream, that carries a revoked token (the emulator's ``revoke_token``).
Goal: the mount refreshes once per revocation, whatever the number of calls
and streams refused, and retries them with the fresh token: reads stay
byte-exact, appends lose and duplicate nothing, the application sees no
error. Only when the fresh token is refused too does the operation fail,
with EACCES and a log line that says why. Short: 3 revocations; soak: 30
(``RAPIDMOUNT_R7_REVOCATIONS``). The tests share one mount: each starts
once it answers with valid tokens again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import random
import threading
import time
from dataclasses import dataclass

import pytest

from rapidmount.emulator import Emulator
from tests.authutil import LocalAuthServer, SeenTokens, clean_env, make_tls_pair, trusted_key_file
from tests.mountutil import HangGuard, Mount
from tests.reliability.conftest import retry_eacces, size

MiB = 1 << 20
BUCKET = "r7-bucket"
OBJECT_SIZE = 8 * MiB

guard = HangGuard(240)
hang_guard = guard.autouse_fixture()


def _workers_ready(m, count: int = 2) -> None:
    deadline = time.monotonic() + 30
    while sum(f"data-plane worker {i} started" in m.log() for i in range(count)) < count:
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)


@dataclass
class Secured:
    emu: Emulator
    token_server: LocalAuthServer
    m: Mount
    log_from: int = 0  # where this test's part of the shared mount's log starts

    def log(self) -> str:
        return self.m.log()[self.log_from:]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One emulator over TLS checking tokens, its token server and one mount, for every test here."""
    tmp_path = tmp_path_factory.mktemp("r7")
    cert, key = make_tls_pair()
    (tmp_path / "ca.pem").write_bytes(cert)
    with LocalAuthServer() as token_server:
        with Emulator(buckets={BUCKET: "zonal"}, tls_cert=cert, tls_key=key,
                      token_validator=SeenTokens(token_server)) as emu:
            _, key_path = trusted_key_file(token_server, tmp_path)
            with guard.mount(emu, BUCKET, "--key-file", key_path, "--ca-file", str(tmp_path / "ca.pem"),
                             "--workers", "2", "--cache-size", "16MiB", "--readahead-max", "4MiB",
                             anonymous=False, env=clean_env(tmp_path)) as m:
                _workers_ready(m)
                yield Secured(emu, token_server, m)


@pytest.fixture
def secure(shared):
    """The shared mount, answering again with valid tokens whatever the test before left.
    (Each test seeds objects in a directory of its own: the mount caches listings.)"""
    shared.emu.set_token_validator(SeenTokens(shared.token_server))
    shared.token_server.refuse(None)
    with contextlib.suppress(FileNotFoundError):
        retry_eacces(lambda: os.stat(shared.m.path / "absent"))
    shared.log_from = len(shared.m.log())
    return shared


def _revoke_all(emu: Emulator, token_server: LocalAuthServer) -> None:
    for token in token_server.issued_tokens():
        emu.revoke_token(token)


def test_r7_a_token_revoked_mid_read_and_mid_append_is_refreshed_once_and_not_seen(secure, report):
    emu, token_server, m = secure.emu, secure.token_server, secure.m
    revocations = size(3, 30, env="RAPIDMOUNT_R7_REVOCATIONS")
    rng = random.Random(7)
    objects = [rng.randbytes(OBJECT_SIZE) for _ in range(revocations)]
    for index, data in enumerate(objects):
        emu.seed(BUCKET, f"data/obj-{index}.bin", data)
    errors: list[str] = []
    wrong = 0
    appended = bytearray()
    initial_grants = token_server.hits("jwt-bearer")
    initial_refused = emu.auth_counts["revoked"]
    log_fd = os.open(m.path / "appended.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for index in range(revocations):
            with open(m.path / "data" / f"obj-{index}.bin", "rb", buffering=0) as reader:
                first = reader.read(MiB)  # the read stream is open, with the current token
                piece = rng.randbytes(MiB + rng.randrange(MiB))
                os.write(log_fd, piece)  # the append stream is open too
                appended += piece
                _revoke_all(emu, token_server)

                def read_rest() -> None:
                    nonlocal wrong
                    try:
                        rest = reader.read()
                    except OSError as err:
                        errors.append(f"read: {os.strerror(err.errno)}")
                        return
                    wrong += hashlib.sha256(first + rest).digest() != hashlib.sha256(objects[index]).digest()

                def append_more() -> None:
                    try:
                        for _ in range(3):
                            more = rng.randbytes(rng.randrange(1, 2 * MiB))
                            os.write(log_fd, more)
                            appended.extend(more)
                            os.fsync(log_fd)
                    except OSError as err:
                        errors.append(f"append: {os.strerror(err.errno)}")

                threads = [threading.Thread(target=read_rest), threading.Thread(target=append_more)]
                for thread in threads:
                    thread.start()
                try:  # a unary call in the same burst
                    os.stat(m.path / "data" / f"absent-{index}")
                except FileNotFoundError:
                    pass
                except OSError as err:
                    errors.append(f"stat: {os.strerror(err.errno)}")
                for thread in threads:
                    thread.join()
    finally:
        os.close(log_fd)
    refreshes = token_server.hits("jwt-bearer") - initial_grants
    log = secure.log()
    stored = emu.read_object(BUCKET, "appended.log")
    lost = max(0, len(appended) - len(stored))
    duplicated = max(0, len(stored) - len(appended))
    refused = emu.auth_counts["revoked"] - initial_refused
    report("R7", f"revoked token mid-read and mid-append: {revocations} revocations, {refused} calls and streams "
                 f"refused, {refreshes} refreshes, {len(errors)} errors seen, {wrong} objects read wrong, "
                 f"{len(stored) >> 10} KiB appended with {lost} bytes lost and {duplicated} duplicated")
    assert not errors, errors
    assert wrong == 0 and stored == bytes(appended)
    assert refused >= revocations  # the revocations were felt...
    assert refreshes == revocations  # ...and each burst of refusals cost one refresh
    assert "Traceback" not in log


def test_r7_a_refused_fresh_token_is_eacces_with_one_line_saying_why(secure, report):
    emu, token_server, m = secure.emu, secure.token_server, secure.m
    emu.seed(BUCKET, "held/held.bin", random.Random(8).randbytes(OBJECT_SIZE))
    emu.seed(BUCKET, "other/later.txt", b"later")
    with open(m.path / "held" / "held.bin", "rb", buffering=0) as held:
        held.read(MiB)
        grants = token_server.hits("jwt-bearer")
        emu.set_token_validator(lambda token: False)  # every token, fresh ones too
        _revoke_all(emu, token_server)
        started = time.monotonic()
        with pytest.raises(OSError) as read_failure:
            os.pread(held.fileno(), MiB, 6 * MiB)  # on the open read stream
        read_seconds = time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(OSError) as stat_failure:
            os.stat(m.path / "other" / "later.txt")  # unary calls
        stat_seconds = time.monotonic() - started
        fresh_tokens = token_server.hits("jwt-bearer") - grants
    log = secure.log()
    lines = [line for line in log.splitlines() if "fresh credentials were refused too" in line]
    report("R7", f"a refused fresh token: EACCES in {read_seconds:.2f} s (read), {stat_seconds:.2f} s (stat), "
                 f"{fresh_tokens} fresh token(s) tried, {len(lines)} log lines saying so")
    assert read_failure.value.errno == errno.EACCES and stat_failure.value.errno == errno.EACCES
    assert read_seconds < 5 and stat_seconds < 5
    # One per refused operation (the kernel may make several of one read), at most one a second.
    assert 1 <= fresh_tokens <= 1 + math.ceil(read_seconds + stat_seconds)
    assert lines and all("UNAUTHENTICATED" in line and "ERROR" in line for line in lines)
    assert "Traceback" not in log


def test_r7_a_revoked_token_without_a_fresh_one_is_eacces_and_recovers_by_itself(secure, report):
    emu, token_server, m = secure.emu, secure.token_server, secure.m
    emu.seed(BUCKET, "after/after.txt", b"after")
    token_server.refuse("invalid_grant")
    _revoke_all(emu, token_server)
    started = time.monotonic()
    with pytest.raises(OSError) as failure:
        os.stat(m.path / "after" / "after.txt")
    seconds = time.monotonic() - started
    token_server.refuse(None)
    recovered = retry_eacces((m.path / "after" / "after.txt").read_bytes)
    recovery_seconds = time.monotonic() - started
    log = secure.log()
    reasons = [line for line in log.splitlines()
               if "no fresh credentials: cannot get an access token: invalid_grant" in line]
    report("R7", f"a revoked token and a token endpoint that refuses: "
                 f"{errno.errorcode.get(failure.value.errno)} in {seconds:.2f} s, {len(reasons)} log lines saying "
                 f"why; recovered by itself {recovery_seconds:.1f} s later")
    assert failure.value.errno == errno.EACCES and seconds < 5
    assert reasons and all("ERROR" in line for line in reasons)
    assert recovered == b"after"
    assert "Traceback" not in log
