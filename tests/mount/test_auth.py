"""Mounting with real credentials, over TLS, through real FUSE mounts.

The emulator serves TLS (a certificate made here) and checks bearer tokens
against a local OAuth token endpoint / metadata server (tests/authutil.py),
which stands in for Google's: google-auth talks to it over HTTP exactly as
it would to Google (a key file's ``token_uri``, ``GCE_METADATA_HOST``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import subprocess
import time

import pytest

from rapidmount.daemon import cli
from rapidmount.emulator import Emulator
from tests.authutil import (LocalAuthServer, SeenTokens, clean_env, make_tls_pair, refresh_token_info, secret_lines,
                            trusted_key_file)
from tests.mountutil import HangGuard, errno_name, errno_of, is_mounted, rapidmount_command, require_fuse, write_all
from tests.polling import until

MiB = 1 << 20
BUCKET = "auth-mount-bucket"
FLAT = "auth-flat-bucket"

guard = HangGuard(150)
hang_guard = guard.autouse_fixture()


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[bytes, bytes, str]:
    cert, key = make_tls_pair()
    ca_file = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca_file.write_bytes(cert)
    return cert, key, str(ca_file)


@pytest.fixture
def token_server():
    with LocalAuthServer() as server:
        yield server


@pytest.fixture
def secure_emu(tls, token_server):
    cert, key, _ = tls
    seen = SeenTokens(token_server)
    with Emulator(buckets={BUCKET: "zonal", FLAT: "flat"}, tls_cert=cert, tls_key=key,
                  token_validator=seen) as emulator:
        emulator.seen_tokens = seen
        yield emulator


def _assert_no_secrets(mount_log: str, stderr: str, secrets: list[str]) -> None:
    for secret in secrets:
        assert secret not in mount_log, "a secret is in the log file"
        assert secret not in stderr, "a secret is on stderr"


def _roundtrip(mount, emu: Emulator, bucket: str = BUCKET) -> None:
    emu.seed(bucket, "dir/hello.txt", b"hello over tls")
    assert (mount.path / "dir" / "hello.txt").read_bytes() == b"hello over tls"
    data = random.Random(7).randbytes(3 * MiB + 17)
    fd = os.open(mount.path / "dir" / "written.bin", os.O_WRONLY | os.O_CREAT)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    assert emu.read_object(bucket, "dir/written.bin") == data
    assert sorted(os.listdir(mount.path / "dir")) == ["hello.txt", "written.bin"]


# -- the three sources of credentials ---------------------------------------------------------------------


def test_service_account_key_file_over_tls(secure_emu, token_server, tls, tmp_path):
    key, key_path = trusted_key_file(token_server, tmp_path)
    with guard.mount(secure_emu, BUCKET, "--key-file", key_path, "--ca-file", tls[2],
                     anonymous=False, env=clean_env(tmp_path)) as m:
        _roundtrip(m, secure_emu)
        log = m.log()
    stderr = m.process.stderr.read().decode(errors="replace")
    assert token_server.hits("jwt-bearer") >= 1
    counts = secure_emu.auth_counts
    assert counts["accepted"] > 0 and counts["missing"] == counts["rejected"] == 0
    assert secure_emu.seen_tokens.accepted <= set(token_server.issued_tokens())
    assert "credentials: oauth2.service_account.Credentials (mount-test@" in log
    assert "(tls, access tokens)" in log
    _assert_no_secrets(log, stderr, [*token_server.issued_tokens(), *secret_lines(key.private_pem)])


def test_metadata_server_credentials(secure_emu, token_server, tls, tmp_path):
    env = clean_env(tmp_path, **token_server.metadata_env())
    with guard.mount(secure_emu, BUCKET, "--ca-file", tls[2], anonymous=False, env=env) as m:
        _roundtrip(m, secure_emu)
        log = m.log()
    assert token_server.hits("ping") >= 1 and token_server.hits("metadata-token") >= 1
    assert secure_emu.auth_counts["accepted"] > 0 and secure_emu.auth_counts["rejected"] == 0
    assert "compute_engine.credentials.Credentials" in log
    _assert_no_secrets(log, m.process.stderr.read().decode(errors="replace"), token_server.issued_tokens())


@pytest.mark.parametrize("kind", ["service-account", "refresh-token"])
def test_google_application_credentials_and_no_secret_in_debug_logs(kind, secure_emu, token_server, tls,
                                                                    tmp_path):
    if kind == "service-account":
        key, path = trusted_key_file(token_server, tmp_path)
        secrets, grant, label = secret_lines(key.private_pem), "jwt-bearer", "service_account.Credentials"
    else:
        refresh_token = token_server.add_refresh_token()
        info = refresh_token_info(token_server.token_uri, refresh_token)
        path = tmp_path / "adc.json"
        path.write_text(json.dumps(info))
        secrets, grant = [refresh_token, info["client_secret"]], "refresh_token"
        label = "external_account_authorized_user.Credentials"
    env = clean_env(tmp_path, GOOGLE_APPLICATION_CREDENTIALS=str(path))
    # mounted() runs the daemon with --log-level debug and --log-file.
    with guard.mount(secure_emu, BUCKET, "--ca-file", tls[2], anonymous=False, env=env) as m:
        _roundtrip(m, secure_emu)
        log = m.log()
    stderr = m.process.stderr.read().decode(errors="replace")
    assert token_server.hits(grant) >= 1
    assert "DEBUG" in log and label in log
    _assert_no_secrets(log, stderr, [*secrets, *token_server.issued_tokens()])


# -- tokens that expire -----------------------------------------------------------------------------------


def test_tokens_expiring_mid_read_are_refreshed_without_an_error(secure_emu, token_server, tls, tmp_path):
    token_server.set_lifetime(5.0)
    big = random.Random(1).randbytes(40 * MiB)
    held = random.Random(2).randbytes(16 * MiB)
    secure_emu.seed(BUCKET, "big.bin", big)
    secure_emu.seed(BUCKET, "held.bin", held)
    # Every read stream breaks after 4 MiB, so reading goes on over new streams,
    # each opened with whatever token the mount holds at that moment.
    secure_emu.add_fault("broken-read:after=4194304,count=inf")
    _, key_path = trusted_key_file(token_server, tmp_path)
    with guard.mount(secure_emu, BUCKET, "--key-file", key_path, "--ca-file", tls[2], "--cache-size", "16MiB",
                     "--readahead-max", "4MiB", anonymous=False, env=clean_env(tmp_path)) as m:
        with open(m.path / "held.bin", "rb", buffering=0) as held_file:
            first = held_file.read(1 * MiB)
            digest = hashlib.sha256()
            with open(m.path / "big.bin", "rb", buffering=0) as big_file:
                started = time.monotonic()
                while chunk := big_file.read(MiB):
                    digest.update(chunk)
                    # Spread the read over about three token lifetimes.
                    time.sleep(max(0.0, 0.3 - (time.monotonic() - started) / 1000))
            assert digest.digest() == hashlib.sha256(big).digest()
            rest = held_file.read()  # a handle opened two tokens ago
        assert first + rest == held
        log = m.log()
    assert token_server.hits("jwt-bearer") >= 3
    assert len(secure_emu.seen_tokens.accepted) >= 3
    assert secure_emu.auth_counts["rejected"] == secure_emu.auth_counts["missing"] == 0
    assert "Traceback" not in log


def test_a_refresh_that_keeps_failing_is_eio_after_the_retry_deadline(secure_emu, token_server, tls, tmp_path):
    token_server.set_lifetime(4.0)
    _, key_path = trusted_key_file(token_server, tmp_path)
    # --metadata-ttl 0: the stat must reach the bucket, even if something on the
    # machine listed the mount (and cached late.txt) meanwhile.
    with guard.mount(secure_emu, BUCKET, "--key-file", key_path, "--ca-file", tls[2], "--retry-deadline", "2",
                     "--metadata-ttl", "0", anonymous=False, env=clean_env(tmp_path)) as m:
        secure_emu.seed(BUCKET, "late.txt", b"late")
        token_server.refuse("invalid_grant")

        def stat_fails_with_eio() -> bool:
            started = time.monotonic()
            code = errno_of(lambda: os.stat(m.path / "late.txt"))
            assert time.monotonic() - started < 30, "a stat without a token waited past the retry deadline"
            # Until the 4 s token expires the stats work; one that carries it as it
            # expires is refused by the service (EACCES); then no token can be had.
            assert code in (None, errno.EACCES, errno.EIO), errno_name(code)
            return code == errno.EIO

        until(stat_fails_with_eio, 60, "EIO once the token expired")
        token_server.refuse(None)
        deadline = time.monotonic() + 60
        while True:  # the refresh backoff passes, then the mount recovers by itself
            try:
                assert (m.path / "late.txt").read_bytes() == b"late"
                break
            except OSError as err:
                assert err.errno == errno.EIO and time.monotonic() < deadline
                time.sleep(0.5)
        log = m.log()
    lines = [line for line in log.splitlines() if "cannot get an access token: invalid_grant" in line]
    assert lines and any("WARNING" in line for line in lines)
    assert "access token refreshed after" in log
    assert "Traceback" not in log


# -- credentials that do not work -----------------------------------------------------------------------


def _failed_mount(endpoint: str, *flags: str, env: dict[str, str], tmp_path, foreground: bool = True,
                  bucket: str = BUCKET) -> tuple[int, str, str]:
    """Run a mount that must fail: (exit status, stderr, log file)."""
    require_fuse()
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir(exist_ok=True)
    log_file = tmp_path / "failed-mount.log"
    command = rapidmount_command(*(("--foreground",) if foreground else ()), "--endpoint", endpoint,
                                 "--connect-timeout", "3", "--log-file", str(log_file), *flags,
                                 bucket, str(mountpoint))
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=90)
    finally:
        assert not is_mounted(str(mountpoint))
    log = log_file.read_text() if log_file.exists() else ""
    assert "Traceback" not in log, log
    return result.returncode, result.stderr, log


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("rapidmount: error: ") and "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("case, expected", [
    ("no-adc", "no Google credentials found"),
    ("no-adc-daemon", "no Google credentials found"),
    ("missing-key-file", "--key-file: cannot read"),
    ("garbled-key-file", "is not a usable key file"),
    ("bad-private-key", "is not a usable key file"),
    ("token-refused", "cannot get an access token: invalid_grant: Account has been disabled."),
    ("token-endpoint-down", "cannot get an access token"),
    ("token-endpoint-hangs", "cannot get an access token"),
    ("adc-token-refused", "cannot get an access token: "),
    ("token-rejected-by-storage", "the storage endpoint rejected the credentials"),
    ("unreadable-ca-file", "--ca-file: cannot read"),
])
def test_bad_or_missing_credentials_are_one_line_and_cannot_mount(case, expected, secure_emu, token_server, tls,
                                                            tmp_path):
    env = clean_env(tmp_path)
    flags = ["--ca-file", tls[2]]
    key, key_path = trusted_key_file(token_server, tmp_path)
    secrets = secret_lines(key.private_pem)
    if case == "missing-key-file":
        flags += ["--key-file", str(tmp_path / "absent.json")]
    elif case == "garbled-key-file":
        (tmp_path / "garbled.json").write_text(key.private_pem[:200])
        flags += ["--key-file", str(tmp_path / "garbled.json")]
    elif case == "bad-private-key":
        broken = dict(key.info, private_key=key.private_pem.replace("A", "B", 40)[:-100])
        (tmp_path / "broken.json").write_text(json.dumps(broken))
        secrets = secret_lines(broken["private_key"])
        flags += ["--key-file", str(tmp_path / "broken.json")]
    elif case == "token-refused":
        token_server.refuse("invalid_grant")
        flags += ["--key-file", key_path]
    elif case == "token-endpoint-down":
        token_server.refuse("unavailable")
        flags += ["--key-file", key_path]
    elif case == "token-endpoint-hangs":
        token_server.hold()
        flags += ["--key-file", key_path]
    elif case == "adc-token-refused":
        info = refresh_token_info(token_server.token_uri, "refresh-unknown")
        (tmp_path / "adc.json").write_text(json.dumps(info))
        env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / "adc.json")
        secrets = ["refresh-unknown", info["client_secret"]]
    elif case == "token-rejected-by-storage":
        secure_emu.set_token_validator(lambda token: False)
        flags += ["--key-file", key_path]
    elif case == "unreadable-ca-file":
        flags = ["--ca-file", str(tmp_path), "--key-file", key_path]
    started = time.monotonic()
    try:
        code, stderr, log = _failed_mount(secure_emu.endpoint, *flags, env=env, tmp_path=tmp_path,
                                          foreground=case != "no-adc-daemon")
    finally:
        token_server.release()
    assert time.monotonic() - started < 60  # bounded by --connect-timeout 3, give or take
    assert code == cli.EXIT_CANNOT_MOUNT
    assert expected in _one_line(stderr)
    _assert_no_secrets(log, stderr, [*secrets, *token_server.issued_tokens()])


def test_a_certificate_from_another_authority_fails_the_mount(secure_emu, token_server, tmp_path):
    other = tmp_path / "other-ca.pem"
    other.write_bytes(make_tls_pair()[0])
    _, key_path = trusted_key_file(token_server, tmp_path)
    code, stderr, _ = _failed_mount(secure_emu.endpoint, "--ca-file", str(other), "--key-file", key_path,
                                    env=clean_env(tmp_path), tmp_path=tmp_path)
    assert code == cli.EXIT_CANNOT_MOUNT
    line = _one_line(stderr)
    assert "cannot reach the storage endpoint" in line and "certificate" in line.lower()


# -- requester pays and the bucket type ---------------------------------------------------------------------


@pytest.mark.parametrize("bucket", [BUCKET, FLAT])
def test_requester_pays_needs_billing_project_on_every_call(bucket, tmp_path):
    with Emulator(buckets={BUCKET: "zonal", FLAT: "flat"}, requester_pays=[BUCKET, FLAT]) as emu:
        code, stderr, _ = _failed_mount(emu.endpoint, "--anonymous", env=dict(os.environ), tmp_path=tmp_path,
                                        bucket=bucket)
        assert code == cli.EXIT_CANNOT_MOUNT and "requester-pays bucket: give --billing-project" in _one_line(stderr)
        with guard.mount(emu, bucket, "--billing-project", "billing-project-1") as m:
            _roundtrip(m, emu, bucket)
            log = m.log()
        counts = emu.rpc_counts
    # Reads and writes went over the streams of each bucket type, all billed.
    if bucket == BUCKET:
        assert counts.get("BidiReadObject", 0) > 0 and counts.get("BidiWriteObject", 0) > 0
        assert "zonal (detected)" in log
    else:
        assert counts.get("ReadObject", 0) > 0 and counts.get("WriteObject", 0) > 0
        assert "regional (detected)" in log
    assert emu.access.billed_projects == {"billing-project-1"}


def test_bucket_type_can_be_forced(tmp_path):
    with Emulator(buckets={BUCKET: "zonal"}) as emu:
        emu.seed(BUCKET, "a.bin", b"a" * 100_000)
        with guard.mount(emu, BUCKET, "--bucket-type", "regional") as m:
            emu.reset_rpc_counts()
            assert (m.path / "a.bin").read_bytes() == b"a" * 100_000
            log = m.log()
        counts = emu.rpc_counts
    assert "regional (forced by --bucket-type; detected zonal)" in log
    assert counts.get("ReadObject", 0) > 0 and counts.get("BidiReadObject", 0) == 0
