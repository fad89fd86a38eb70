"""Access tokens: when they are refreshed, how failures surface, where the blocking runs.

The credentials are real google-auth service-account credentials; their
token endpoint is a local stand-in (tests/authutil.py) on loopback.
"""

from __future__ import annotations

import asyncio
import datetime
import threading

import grpc
import pytest

from rapidmount.shared import wire
from rapidmount.shared import auth
from rapidmount.shared.auth import Freshness, TokenLife
from rapidmount.emulator import Emulator
from tests.authutil import LocalAuthServer, make_service_account_key, make_tls_pair
from tests.clock import FakeClock

BUCKET = "auth-unit-bucket"


# -- the refresh policy (pure) ---------------------------------------------------------------------


def test_an_hour_long_token_is_refreshed_3m45s_ahead_and_dropped_10s_before_expiry():
    life = TokenLife(obtained=100.0, expires=3700.0)
    assert life.refresh_due == pytest.approx(3700.0 - 225.0)
    assert life.usable_until == pytest.approx(3700.0 - 10.0)
    assert life.freshness(100.0) is Freshness.FRESH
    assert life.freshness(3474.9) is Freshness.FRESH
    assert life.freshness(3475.0) is Freshness.STALE
    assert life.freshness(3689.9) is Freshness.STALE
    assert life.freshness(3690.0) is Freshness.EXPIRED
    assert life.freshness(5000.0) is Freshness.EXPIRED


def test_a_short_token_is_refreshed_in_proportion_to_its_lifetime():
    life = TokenLife(obtained=0.0, expires=8.0)
    assert life.refresh_due == pytest.approx(6.0)  # the last quarter
    assert life.usable_until == pytest.approx(7.2)  # the last tenth
    assert TokenLife(0.0, None).freshness(1e12) is Freshness.FRESH


def test_expiry_from_google_auth_maps_onto_the_monotonic_clock():
    now = datetime.datetime(2026, 1, 1, 12, 0, 0)
    life = auth.life_from_expiry(50.0, now + datetime.timedelta(seconds=3599), now)
    assert (life.obtained, life.expires) == (50.0, pytest.approx(3649.0))
    aware = (now + datetime.timedelta(seconds=60)).replace(tzinfo=datetime.timezone.utc)
    assert auth.life_from_expiry(0.0, aware, now).expires == pytest.approx(60.0)
    assert auth.life_from_expiry(0.0, None, now).expires is None


def test_retry_delays_double_up_to_a_cap():
    delays = [auth.next_retry_delay(n) for n in range(1, 10)]
    assert delays[:3] == [0.5, 1.0, 2.0]
    assert max(delays) == auth.RETRY_MAX_S and delays == sorted(delays)


def test_failures_are_described_on_one_bounded_line():
    err = ValueError("invalid_grant:\n  Account has been disabled.", {"error": "invalid_grant"})
    assert auth.describe_failure(err) == "invalid_grant: Account has been disabled."
    long = auth.describe_failure(RuntimeError("x" * 1000))
    assert len(long) == 300 and long.endswith("...")
    assert auth.describe_failure(KeyError()) == "KeyError"


# -- TokenSource against a local token endpoint ---------------------------------------------------------


@pytest.fixture
def endpoint():
    with LocalAuthServer(lifetime_s=100.0) as server:
        yield server


def _source(endpoint: LocalAuthServer, tmp_path, clock: FakeClock | None = None) -> auth.TokenSource:
    key = make_service_account_key(endpoint.token_uri)
    endpoint.trust_key(key)
    credentials = auth.load_credentials(key.write(tmp_path / "key.json"))
    return auth.TokenSource(credentials, clock=clock or FakeClock())


def test_a_fresh_token_is_reused_and_a_stale_one_replaced(endpoint, tmp_path):
    clock = FakeClock()
    source = _source(endpoint, tmp_path, clock)
    first = source.header()
    assert first.startswith("Bearer ") and endpoint.token_is_valid(first.split()[1])
    clock.now += 70.0  # fresh until 75 s (the last quarter of 100 s)
    assert source.header() == first and endpoint.hits("jwt-bearer") == 1
    clock.now += 10.0
    second = source.header()
    assert second != first and endpoint.hits("jwt-bearer") == 2 and source.refreshes == 2


def test_while_one_call_refreshes_a_stale_token_the_others_keep_using_it(endpoint, tmp_path):
    clock = FakeClock()
    source = _source(endpoint, tmp_path, clock)
    old = source.header()
    clock.now += 80.0  # stale, not expired
    endpoint.hold()
    refreshed: list[str] = []
    refresher = threading.Thread(target=lambda: refreshed.append(source.header()))
    refresher.start()
    try:
        assert endpoint.waiting.wait(10)
        assert source.header() == old  # not blocked behind the refresh
    finally:
        endpoint.release()
        refresher.join(10)
    assert refreshed and refreshed[0] != old and source.header() == refreshed[0]


def test_an_expired_token_is_never_sent_and_callers_wait_for_the_refresh(endpoint, tmp_path):
    clock = FakeClock()
    source = _source(endpoint, tmp_path, clock)
    old = source.header()
    clock.now += 96.0  # inside the last 10 s: expired for sending
    endpoint.hold()
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(source.header())) for _ in range(3)]
    for thread in threads:
        thread.start()
    assert endpoint.waiting.wait(10)
    endpoint.release()
    for thread in threads:
        thread.join(10)
    assert len(results) == 3 and len(set(results)) == 1 and results[0] != old
    assert endpoint.hits("jwt-bearer") == 2  # one refresh served all three


def test_a_refused_refresh_fails_calls_fast_until_the_backoff_passes(endpoint, tmp_path, caplog):
    clock = FakeClock()
    source = _source(endpoint, tmp_path, clock)
    token = source.header().split()[1]
    clock.now += 200.0
    endpoint.refuse("invalid_grant")
    with pytest.raises(auth.CredentialsError, match="invalid_grant: Account has been disabled"):
        source.header()
    hits = endpoint.hits("jwt-bearer")
    with pytest.raises(auth.CredentialsError, match="invalid_grant"):
        source.header()  # within the backoff: no new request
    assert endpoint.hits("jwt-bearer") == hits
    endpoint.refuse(None)
    clock.now += auth.RETRY_MAX_S
    assert source.header().startswith("Bearer ")
    warnings = [r for r in caplog.records if r.name == "rapidmount.auth" and r.levelname == "WARNING"]
    assert len(warnings) == 1 and "invalid_grant" in warnings[0].getMessage()
    assert all(token not in r.getMessage() for r in caplog.records)


def test_a_stale_token_survives_a_failed_refresh(endpoint, tmp_path):
    clock = FakeClock()
    source = _source(endpoint, tmp_path, clock)
    old = source.header()
    clock.now += 80.0
    endpoint.refuse("invalid_grant")
    assert source.header() == old  # still usable for 10 s: keep going, retry later
    assert source.header() == old


def test_renew_refreshes_a_refused_token_once_for_every_caller_that_saw_it_refused(endpoint, tmp_path):
    clock = FakeClock()
    source = _source(endpoint, tmp_path, clock)
    refused = source.header()  # fresh for another 75 s, but the service refused it
    fresh, usable_for, _ = source.renew(refused)
    assert fresh != refused and usable_for > 80 and endpoint.hits("jwt-bearer") == 2
    assert source.renew(refused)[0] == fresh  # a late caller of the same burst: no new refresh
    assert source.header() == fresh and endpoint.hits("jwt-bearer") == 2


def test_renew_fails_at_once_while_backing_off_after_a_refused_refresh(endpoint, tmp_path):
    source = _source(endpoint, tmp_path)
    refused = source.header()
    endpoint.refuse("invalid_grant")
    with pytest.raises(auth.CredentialsError, match="invalid_grant"):
        source.renew(refused)
    with pytest.raises(auth.CredentialsError, match="invalid_grant"):
        source.renew(refused)
    assert endpoint.hits("jwt-bearer") == 2  # the second within the backoff: no request


def test_fetch_retries_a_failing_endpoint_until_its_deadline(endpoint, tmp_path):
    source = auth.TokenSource(auth.load_credentials(_key_file(endpoint, tmp_path)))
    endpoint.refuse("unavailable")
    with pytest.raises(auth.CredentialsError, match="cannot get an access token"):
        source.fetch(1.0)
    assert endpoint.hits("jwt-bearer") >= 2  # google-auth's own retry, at least


def test_fetch_gives_up_at_once_on_a_refusal(endpoint, tmp_path):
    source = auth.TokenSource(auth.load_credentials(_key_file(endpoint, tmp_path)))
    endpoint.refuse("invalid_grant")
    with pytest.raises(auth.CredentialsError, match="invalid_grant"):
        source.fetch(30.0)
    assert endpoint.hits("jwt-bearer") == 1


def _key_file(endpoint: LocalAuthServer, tmp_path) -> str:
    key = make_service_account_key(endpoint.token_uri)
    endpoint.trust_key(key)
    return key.write(tmp_path / "key.json")


# -- where the plugin runs -----------------------------------------------------------------------------


def test_the_token_plugin_runs_off_the_event_loop_and_a_slow_refresh_does_not_stall_it(endpoint, tmp_path):
    cert, key = make_tls_pair()
    plugin_threads: list[threading.Thread] = []

    class RecordingSource(auth.TokenSource):
        def header(self) -> str:
            plugin_threads.append(threading.current_thread())
            return super().header()

    source = RecordingSource(auth.load_credentials(_key_file(endpoint, tmp_path)))
    request = wire.control.GetStorageLayoutRequest(name=f"projects/_/buckets/{BUCKET}/storageLayout")
    method = wire.CONTROL_METHODS["GetStorageLayout"]

    async def scenario(emu: Emulator) -> tuple[threading.Thread, int]:
        credentials = grpc.composite_channel_credentials(grpc.ssl_channel_credentials(cert),
                                                         auth.call_credentials(source))
        async with grpc.aio.secure_channel(emu.endpoint, credentials) as channel:
            call = channel.unary_unary(method.path, request_serializer=method.request.SerializeToString,
                                       response_deserializer=method.response.FromString)
            endpoint.hold()  # the first token request blocks until the loop says so
            pending = asyncio.ensure_future(call(request, timeout=30))
            ticks = 0
            assert await asyncio.to_thread(endpoint.waiting.wait, 10), "no token request came"
            for _ in range(20):  # the loop runs while the refresh is blocked
                await asyncio.sleep(0.005)
                ticks += 1
            assert not pending.done()
            endpoint.release()
            layout = await pending
            assert layout.location_type == "zone"
            return threading.current_thread(), ticks

    with Emulator(buckets={BUCKET: "zonal"}, tls_cert=cert, tls_key=key,
                  token_validator=endpoint.token_is_valid) as emu:
        loop_thread, ticks = asyncio.run(scenario(emu))
        assert emu.auth_counts["accepted"] == 1
    assert ticks == 20
    assert plugin_threads and all(thread is not loop_thread for thread in plugin_threads)


def test_a_failing_plugin_fails_the_call_with_unavailable_and_the_reason(endpoint, tmp_path):
    cert, key = make_tls_pair()
    source = auth.TokenSource(auth.load_credentials(_key_file(endpoint, tmp_path)))
    endpoint.refuse("invalid_grant")
    request = wire.control.GetStorageLayoutRequest(name=f"projects/_/buckets/{BUCKET}/storageLayout")
    method = wire.CONTROL_METHODS["GetStorageLayout"]

    async def scenario(emu: Emulator) -> grpc.aio.AioRpcError:
        credentials = grpc.composite_channel_credentials(grpc.ssl_channel_credentials(cert),
                                                         auth.call_credentials(source))
        async with grpc.aio.secure_channel(emu.endpoint, credentials) as channel:
            call = channel.unary_unary(method.path, request_serializer=method.request.SerializeToString,
                                       response_deserializer=method.response.FromString)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await call(request, timeout=30)
            return failure.value

    with Emulator(buckets={BUCKET: "zonal"}, tls_cert=cert, tls_key=key,
                  token_validator=endpoint.token_is_valid) as emu:
        err = asyncio.run(scenario(emu))
        assert emu.rpc_counts.get("GetStorageLayout", 0) == 0  # nothing was sent
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot get an access token: invalid_grant" in err.details()
