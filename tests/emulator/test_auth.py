"""The emulator over TLS, with bearer-token checks and requester-pays buckets."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from rapidmount.shared import wire
from rapidmount.emulator import Emulator
from tests.authutil import make_tls_pair

S, C = wire.storage, wire.control
BUCKET = "auth-emu-bucket"


@pytest.fixture(scope="module")
def tls_pair() -> tuple[bytes, bytes]:
    return make_tls_pair()


def _call(endpoint: str, name: str, request, *, ca: bytes | None = None, metadata=()):
    """One unary call over TLS (``ca``) or plaintext; returns the response or raises RpcError."""
    method = wire.STORAGE_METHODS.get(name) or wire.CONTROL_METHODS[name]
    channel = (grpc.secure_channel(endpoint, grpc.ssl_channel_credentials(ca)) if ca is not None
               else grpc.insecure_channel(endpoint))
    with channel:
        call = channel.unary_unary(method.path, request_serializer=method.request.SerializeToString,
                                   response_deserializer=method.response.FromString)
        return call(request, metadata=tuple(metadata), timeout=20)


def _layout(bucket: str = BUCKET):
    return C.GetStorageLayoutRequest(name=f"projects/_/buckets/{bucket}/storageLayout")


def _code(excinfo) -> grpc.StatusCode:
    return excinfo.value.code()


def test_tls_and_a_required_token(tls_pair):
    cert, key = tls_pair
    with Emulator(buckets={BUCKET: "zonal"}, tls_cert=cert, tls_key=key, require_token="sesame") as emu:
        with pytest.raises(grpc.RpcError) as missing:
            _call(emu.endpoint, "GetStorageLayout", _layout(), ca=cert)
        assert _code(missing) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as wrong:
            _call(emu.endpoint, "GetStorageLayout", _layout(), ca=cert, metadata=[("authorization", "Bearer nope")])
        assert _code(wrong) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as scheme:
            _call(emu.endpoint, "GetStorageLayout", _layout(), ca=cert, metadata=[("authorization", "Basic sesame")])
        assert _code(scheme) == grpc.StatusCode.UNAUTHENTICATED
        layout = _call(emu.endpoint, "GetStorageLayout", _layout(), ca=cert,
                       metadata=[("authorization", "Bearer sesame")])
        assert layout.location_type == "zone"
        assert emu.auth_counts == {"accepted": 1, "missing": 1, "rejected": 2, "revoked": 0, "billed": 0}
        # A plaintext client cannot talk to a TLS emulator.
        with pytest.raises(grpc.RpcError) as plaintext:
            _call(emu.endpoint, "GetStorageLayout", _layout(), metadata=[("authorization", "Bearer sesame")])
        assert _code(plaintext) == grpc.StatusCode.UNAVAILABLE


def test_a_validator_can_rotate_tokens_and_streams_are_checked_too():
    valid = {"first"}
    with Emulator(buckets={BUCKET: "zonal"}, token_validator=lambda token: token in valid) as emu:
        emu.seed(BUCKET, "obj", b"data")
        request = S.ReadObjectRequest(bucket=f"projects/_/buckets/{BUCKET}", object="obj")
        method = wire.STORAGE_METHODS["ReadObject"]
        with grpc.insecure_channel(emu.endpoint) as channel:
            read = channel.unary_stream(method.path, request_serializer=method.request.SerializeToString,
                                        response_deserializer=method.response.FromString)
            chunks = list(read(request, metadata=[("authorization", "Bearer first")], timeout=20))
            assert b"".join(c.checksummed_data.content for c in chunks) == b"data"
            valid.clear()
            valid.add("second")
            with pytest.raises(grpc.RpcError) as stale:
                list(read(request, metadata=[("authorization", "Bearer first")], timeout=20))
            assert _code(stale) == grpc.StatusCode.UNAUTHENTICATED
            assert list(read(request, metadata=[("authorization", "Bearer second")], timeout=20))
        emu.set_token_validator(None)
        assert _call(emu.endpoint, "GetStorageLayout", _layout()).location_type == "zone"


def test_a_revoked_token_is_refused_and_ends_the_open_streams_that_carry_it():
    import queue

    with Emulator(buckets={BUCKET: "zonal"}, token_validator=lambda token: token in {"one", "two"}) as emu:
        emu.seed(BUCKET, "obj", b"x" * 100)
        resource = f"projects/_/buckets/{BUCKET}"
        read_method, write_method = wire.STORAGE_METHODS["BidiReadObject"], wire.STORAGE_METHODS["BidiWriteObject"]
        with grpc.insecure_channel(emu.endpoint) as channel:
            def stream(method, first):
                requests: queue.Queue = queue.Queue()
                requests.put(first)
                call = getattr(channel, method.kind)(
                    method.path, request_serializer=method.request.SerializeToString,
                    response_deserializer=method.response.FromString)(
                    iter(requests.get, None), metadata=[("authorization", "Bearer one")], timeout=20)
                return requests, call

            reads, read_call = stream(read_method, S.BidiReadObjectRequest(
                read_object_spec=S.BidiReadObjectSpec(bucket=resource, object="obj"),
                read_ranges=[S.ReadRange(read_offset=0, read_length=10, read_id=1)]))
            response = next(read_call)
            while not response.object_data_ranges:  # the metadata may come first, alone
                response = next(read_call)
            assert response.object_data_ranges[0].checksummed_data.content == b"x" * 10
            writes, write_call = stream(write_method, S.BidiWriteObjectRequest(
                write_object_spec=S.WriteObjectSpec(resource=S.Object(bucket=resource, name="new"), appendable=True)))
            assert next(write_call).HasField("resource")  # the open's one answer (no state_lookup: no second)
            emu.revoke_token("one")
            reads.put(S.BidiReadObjectRequest(read_ranges=[S.ReadRange(read_offset=10, read_length=10, read_id=2)]))
            writes.put(S.BidiWriteObjectRequest(write_offset=0, checksummed_data=S.ChecksummedData(content=b"ab"),
                                                state_lookup=True))
            for call in (read_call, write_call):
                with pytest.raises(grpc.RpcError) as ended:
                    next(call)
                assert _code(ended) == grpc.StatusCode.UNAUTHENTICATED and "revoked" in ended.value.details()
            reads.put(None)
            writes.put(None)
        with pytest.raises(grpc.RpcError) as refused:
            _call(emu.endpoint, "GetStorageLayout", _layout(), metadata=[("authorization", "Bearer one")])
        assert _code(refused) == grpc.StatusCode.UNAUTHENTICATED
        assert _call(emu.endpoint, "GetStorageLayout", _layout(), metadata=[("authorization", "Bearer two")])
        assert emu.auth_counts["revoked"] == 3
        assert emu.read_object(BUCKET, "new") == b""  # nothing sent after the revocation was kept


def test_requester_pays_buckets_need_a_billing_project():
    with Emulator(buckets={BUCKET: "zonal", "free-bucket": "flat"}, requester_pays=[BUCKET]) as emu:
        with pytest.raises(grpc.RpcError) as unbilled:
            _call(emu.endpoint, "GetStorageLayout", _layout())
        assert _code(unbilled) == grpc.StatusCode.INVALID_ARGUMENT
        assert "requester pays bucket but no user project provided" in unbilled.value.details()
        with pytest.raises(grpc.RpcError):
            _call(emu.endpoint, "ListObjects", S.ListObjectsRequest(parent=f"projects/_/buckets/{BUCKET}"))
        billed = [("x-goog-user-project", "my-project")]
        assert _call(emu.endpoint, "GetStorageLayout", _layout(), metadata=billed).location_type == "zone"
        assert _call(emu.endpoint, "GetStorageLayout", _layout("free-bucket")).location_type == "region"
        assert emu.access.billed_projects == {"my-project"}
        emu.set_requester_pays(BUCKET, False)
        assert _call(emu.endpoint, "GetStorageLayout", _layout()).location_type == "zone"


def test_tls_needs_both_halves():
    with pytest.raises(ValueError, match="both"):
        Emulator(tls_cert=b"x")
    with pytest.raises(ValueError, match="not both"):
        Emulator(require_token="a", token_validator=lambda token: True)


# -- the command line -----------------------------------------------------------------------------------


def _emulator_command() -> list[str]:
    script = Path(sys.executable).with_name("rapidmount-emulator")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rapidmount.emulator"]


@pytest.fixture
def pem_files(tmp_path, tls_pair) -> tuple[str, str]:
    cert, key = tls_pair
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    return str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")


def test_cli_serves_tls_checks_tokens_and_bills(pem_files, tls_pair):
    cert_path, key_path = pem_files
    process = subprocess.Popen(
        _emulator_command() + ["--bucket", BUCKET, "--tls-cert", cert_path, "--tls-key", key_path,
                               "--require-token", "sesame", "--requester-pays", BUCKET],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", line)
        assert match, (line, process.stderr.read() if process.poll() is not None else "")
        endpoint = f"127.0.0.1:{match.group(1)}"
        token = ("authorization", "Bearer sesame")
        with pytest.raises(grpc.RpcError) as unbilled:
            _call(endpoint, "GetStorageLayout", _layout(), ca=tls_pair[0], metadata=[token])
        assert _code(unbilled) == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as anonymous:
            _call(endpoint, "GetStorageLayout", _layout(), ca=tls_pair[0],
                  metadata=[("x-goog-user-project", "p-123456")])
        assert _code(anonymous) == grpc.StatusCode.UNAUTHENTICATED
        layout = _call(endpoint, "GetStorageLayout", _layout(), ca=tls_pair[0],
                       metadata=[token, ("x-goog-user-project", "p-123456")])
        assert layout.location_type == "zone"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("case", ["cert-only", "missing-file", "not-pem", "mismatched-key", "unknown-bucket",
                                  "empty-token"])
def test_cli_refuses_bad_tls_and_auth_flags_with_one_line(case, pem_files, tmp_path):
    cert_path, key_path = pem_files
    other_key = tmp_path / "other-key.pem"
    other_key.write_bytes(make_tls_pair()[1])
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    args = {
        "cert-only": ["--tls-cert", cert_path],
        "missing-file": ["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", key_path],
        "not-pem": ["--tls-cert", str(junk), "--tls-key", key_path],
        "mismatched-key": ["--tls-cert", cert_path, "--tls-key", str(other_key)],
        "unknown-bucket": ["--bucket", BUCKET, "--requester-pays", "other-bucket"],
        "empty-token": ["--require-token", ""],
    }[case]
    result = subprocess.run(_emulator_command() + args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rapidmount-emulator: error:"), result.stderr
