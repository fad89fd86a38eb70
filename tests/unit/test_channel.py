"""Which channel the mount opens: target, TLS, tokens, DirectPath; and the flags that choose it.

DirectPath itself only exists inside Google's network; here we check what
rapidmount builds for it: the ``google-c2p:///`` target and Compute Engine
channel credentials carrying the per-call token credentials.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rapidmount.daemon import config
from rapidmount.daemon.cli import build_parser
from rapidmount.shared import channel_plan as channel
from rapidmount.shared.channel_plan import ChannelPlan, plan_channel
from rapidmount.workers.client.channel import channel_credentials, make_channel, reconnected


def test_default_is_tls_with_tokens():
    assert plan_channel("storage.googleapis.com:443", anonymous=False, directpath=False, ca_file=False) == \
        ChannelPlan("storage.googleapis.com:443", channel.TLS, tokens=True)


def test_anonymous_is_plaintext_unless_a_ca_file_asks_for_tls():
    assert plan_channel("127.0.0.1:9000", anonymous=True, directpath=False, ca_file=False) == \
        ChannelPlan("127.0.0.1:9000", channel.PLAINTEXT, tokens=False)
    assert plan_channel("127.0.0.1:9000", anonymous=True, directpath=False, ca_file=True) == \
        ChannelPlan("127.0.0.1:9000", channel.TLS, tokens=False)


def test_directpath_targets_google_c2p_on_the_endpoint_host():
    plan = plan_channel("storage.googleapis.com:443", anonymous=False, directpath=True, ca_file=False)
    assert plan == ChannelPlan("google-c2p:///storage.googleapis.com", channel.DIRECTPATH, tokens=True)
    assert channel.directpath_target("google-c2p:///storage.googleapis.com") == "google-c2p:///storage.googleapis.com"
    # A google-c2p endpoint means DirectPath even without the switch.
    assert plan_channel("google-c2p:///storage.googleapis.com", anonymous=False, directpath=False,
                        ca_file=False).security == channel.DIRECTPATH


@pytest.mark.parametrize("anonymous, ca_file, message", [
    (True, False, "cannot be combined with --anonymous"),
    (False, True, "drop --ca-file"),
])
def test_directpath_refuses_what_cannot_work(anonymous, ca_file, message):
    with pytest.raises(ValueError, match=message):
        plan_channel("storage.googleapis.com:443", anonymous=anonymous, directpath=True, ca_file=ca_file)


def test_directpath_wraps_the_token_credentials_in_compute_engine_channel_credentials(monkeypatch):
    seen = []
    real = grpc.compute_engine_channel_credentials

    def spy(call_credentials):
        seen.append(call_credentials)
        return real(call_credentials)

    monkeypatch.setattr(grpc, "compute_engine_channel_credentials", spy)
    tokens = grpc.access_token_call_credentials("unused")
    plan = plan_channel("storage.googleapis.com:443", anonymous=False, directpath=True, ca_file=False)
    credentials = channel_credentials(plan, call_credentials=tokens)
    assert isinstance(credentials, grpc.ChannelCredentials) and seen == [tokens]

    async def build() -> None:  # a channel is lazy: nothing is resolved or dialled here
        opened = make_channel(plan, call_credentials=tokens)
        await opened.close()

    asyncio.run(build())
    assert len(seen) == 2


def test_tokens_without_call_credentials_is_a_bug_caught_early():
    plan = plan_channel("h:443", anonymous=False, directpath=False, ca_file=False)
    with pytest.raises(ValueError):
        channel_credentials(plan)


# -- the flags ------------------------------------------------------------------------------------------


def _config(*argv: str) -> config.MountConfig:
    return config.config_from_args(build_parser().parse_args([*argv, "my-bucket", "/mnt"]))


def test_new_flags_parse_from_the_command_line_and_o_options():
    cfg = _config("--key-file", "/k.json", "--billing-project", "my-project", "--directpath",
                  "--bucket-type", "Regional")
    assert (cfg.key_file, cfg.billing_project, cfg.directpath, cfg.bucket_type) == \
        ("/k.json", "my-project", True, "regional")
    cfg = _config("-o", "ca_file=/ca.pem,billing-project=123456789,bucket_type=zonal")
    assert (cfg.ca_file, cfg.billing_project, cfg.bucket_type, cfg.directpath) == \
        ("/ca.pem", "123456789", "zonal", False)
    assert _config().bucket_type == "auto"


def test_new_flags_work_in_the_config_file(tmp_path):
    path = tmp_path / "rapidmount.toml"
    path.write_text('key-file = "/k.json"\nbilling_project = "my-project"\ndirectpath = true\n'
                    'bucket-type = "zonal"\n')
    cfg = _config("--config-file", str(path))
    assert (cfg.key_file, cfg.billing_project, cfg.directpath, cfg.bucket_type) == \
        ("/k.json", "my-project", True, "zonal")


@pytest.mark.parametrize("argv, message", [
    (("--bucket-type", "fast"), "--bucket-type: not a bucket type: 'fast'"),
    (("--billing-project", "My Project"), "--billing-project: not a Google Cloud project ID"),
    (("--anonymous", "--endpoint", "h:1", "--key-file", "/k"), "--key-file and --anonymous exclude each other"),
    (("--anonymous", "--endpoint", "h:1", "--directpath"), "--directpath needs credentials"),
    (("--directpath", "--ca-file", "/ca.pem"), "--directpath uses Google's own certificates"),
    (("--worker-memory-limit", "16M"), "--worker-memory-limit: must be 0 (no limit) or at least 32MiB"),
])
def test_bad_values_and_combinations_are_one_clear_error(argv, message):
    with pytest.raises(config.ConfigError) as failure:
        _config(*argv)
    assert message in str(failure.value)


# -- the bucket type and mount-time messages --------------------------------------------------------------


def test_bucket_type_detected_or_forced_is_described():
    from rapidmount.storage.model import BucketLayout

    zonal = BucketLayout("b", "us-central1-a", "zone", True)
    assert zonal.zonal and zonal.describe_type() == "zonal (detected)"
    forced = BucketLayout("b", "us-central1-a", "zone", True, forced_type="regional")
    assert not forced.zonal and forced.describe_type() == "regional (forced by --bucket-type; detected zonal)"
    regional = BucketLayout("b", "US", "multi-region", False, forced_type="zonal")
    assert regional.zonal and regional.describe_type() == "zonal (forced by --bucket-type; detected regional)"


def test_a_forced_bucket_type_survives_an_endpoint_without_get_storage_layout():
    from rapidmount.workers.client import connect
    from rapidmount.workers.client.errors import StorageError
    from rapidmount.storage.errors import StorageCode

    unimplemented = StorageError("bucket 'b': UNIMPLEMENTED", code=StorageCode.UNIMPLEMENTED)
    assert connect._forced_layout(_config(), unimplemented) is None  # auto: the mount fails
    layout = connect._forced_layout(_config("--bucket-type", "zonal"), unimplemented)
    assert layout is not None and layout.hierarchical_namespace and layout.location_type == ""
    denied = StorageError("bucket 'b': PERMISSION_DENIED", code=StorageCode.PERMISSION_DENIED)
    assert connect._forced_layout(_config("--bucket-type", "zonal"), denied) is None


@pytest.mark.parametrize("code, detail, flags, expected", [
    ("NOT_FOUND", "no such bucket", (), "bucket 'my-bucket' does not exist"),
    ("INVALID_ARGUMENT", "Bucket x is a requester pays bucket but no user project provided.", (),
     "is a requester-pays bucket: give --billing-project PROJECT"),
    ("INVALID_ARGUMENT", "Bucket x is a requester pays bucket but no user project provided.",
     ("--billing-project", "other-project"), "refused --billing-project other-project"),
    ("UNAUTHENTICATED", "Invalid Credentials", (), "the storage endpoint rejected the credentials"),
    ("PERMISSION_DENIED", "denied", (), "access to bucket 'my-bucket' is denied"),
    ("UNAVAILABLE", "Getting metadata from plugin failed with error: cannot get an access token: x", (),
     "cannot get an access token: x"),
])
def test_mount_time_bucket_errors_say_what_to_do(code, detail, flags, expected):
    from rapidmount.workers.client import connect
    from rapidmount.workers.client.errors import StorageError
    from rapidmount.storage.errors import StorageCode

    err = StorageError(f"bucket 'my-bucket': {code}: {detail}", code=StorageCode[code])
    assert expected in connect._bucket_error(_config(*flags), err)


def test_the_channel_reconnects_within_a_second_of_a_service_back_after_a_long_outage():
    """A service down for 11 s, then back on its address: calls through the
    mount's channel work again within about a second (grpc's own backoff
    would wait until its attempt at 13-19 s)."""
    import socket
    import time

    from rapidmount.shared import wire
    from rapidmount.emulator import Emulator

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    layout = wire.control.GetStorageLayoutRequest(name="projects/_/buckets/reconnect-bucket/storageLayout")

    async def until_served(outage: float) -> float:
        chan = make_channel(plan_channel(endpoint, anonymous=True, directpath=False, ca_file=False))
        call = chan.unary_unary(f"/{wire.CONTROL_SERVICE}/GetStorageLayout",
                                request_serializer=type(layout).SerializeToString,
                                response_deserializer=lambda data: data)
        started = time.monotonic()
        back = None
        try:
            while time.monotonic() - started < outage + 10:
                if back is None and time.monotonic() - started >= outage:
                    back = await asyncio.to_thread(service.start)  # the retry loop of the mount goes on
                try:
                    await call(layout, timeout=1)
                    if back is not None:
                        return time.monotonic() - back
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.05)
            return float("inf")
        finally:
            await chan.close()

    class Service:
        emulator = None

        def start(self) -> float:
            self.emulator = Emulator(buckets={"reconnect-bucket": "zonal"}, port=port).__enter__()
            return time.monotonic()

    service = Service()
    try:
        waited = asyncio.run(until_served(11.0))
    finally:
        if service.emulator is not None:
            service.emulator.__exit__(None, None, None)
    assert waited < 1.5, f"calls worked again only {waited:.1f}s after the service was back"


def test_reconnected_is_false_at_once_when_connected_and_waits_for_a_service_that_comes_back():
    """The retry policy's ``reconnected``: no wait while the channel is
    connected; while it is not, a wait that ends when the service is back on
    its address (or at the timeout, if it is not)."""
    import socket
    import threading
    import time

    from rapidmount.emulator import Emulator

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    emulators = []

    def start() -> None:
        emulators.append(Emulator(buckets={"reconnect-bucket": "zonal"}, port=port).__enter__())

    async def check() -> dict[str, float | bool]:
        chan = make_channel(plan_channel(endpoint, anonymous=True, directpath=False, ca_file=False))
        seen: dict[str, float | bool] = {}
        try:
            started = time.monotonic()
            seen["down"] = await reconnected(chan, 0.5)  # nobody listens: waits out its timeout
            seen["down_waited"] = time.monotonic() - started
            timer = threading.Timer(0.5, start)
            timer.start()
            started = time.monotonic()
            seen["came_back"] = await reconnected(chan, 10.0)
            seen["back_after"] = time.monotonic() - started
            timer.join()
            started = time.monotonic()
            seen["connected"] = await reconnected(chan, 10.0)
            seen["connected_waited"] = time.monotonic() - started
        finally:
            await chan.close()
        return seen

    try:
        seen = asyncio.run(check())
    finally:
        for emulator in emulators:
            emulator.__exit__(None, None, None)
    assert seen["down"] is True and 0.45 <= seen["down_waited"] < 1.5
    assert seen["came_back"] is True and 0.5 <= seen["back_after"] < 3.0
    assert seen["connected"] is False and seen["connected_waited"] < 0.1
