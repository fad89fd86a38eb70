"""The one retry helper and what a final gRPC failure becomes."""

from __future__ import annotations

import asyncio
import dataclasses
import errno

import grpc
import pytest

from rapidmount.workers.client.errors import final_error, is_retryable
from rapidmount.storage.errors import StorageCode, StorageError
from rapidmount.workers.retry import CredentialsRefused, Reauth, RetryPolicy, retry_call
from tests.clock import FakeClock


class Transient(Exception):
    pass


class Fatal(Exception):
    pass


class GaveUp(Exception):
    def __init__(self, err: BaseException, deadline_passed: bool) -> None:
        super().__init__(str(err))
        self.err = err
        self.deadline_passed = deadline_passed


def _retryable(err: BaseException) -> bool:
    return isinstance(err, Transient)


POLICY = RetryPolicy(deadline=0.2, initial_backoff=0.01, max_backoff=0.02)


def _run(attempt, policy: RetryPolicy = POLICY, **hooks):
    return asyncio.run(retry_call(policy, attempt, retryable=_retryable, give_up=GaveUp, **hooks))


def test_success_returns_at_once():
    seen = []

    async def attempt(budget):
        return 42

    assert _run(attempt, on_error=seen.append) == 42 and seen == []


def test_transient_failures_are_retried_then_succeed():
    calls, errors, delays = [], [], []

    async def attempt(budget):
        calls.append(1)
        if len(calls) < 3:
            raise Transient("again")
        return "ok"

    assert _run(attempt, on_error=errors.append, on_retry=lambda err, delay: delays.append(delay)) == "ok"
    assert len(calls) == 3 and len(errors) == 2 and len(delays) == 2
    assert all(0 <= d <= POLICY.max_backoff for d in delays)


def test_a_failure_that_is_not_retryable_is_raised_at_once():
    calls, retries = [], []

    async def attempt(budget):
        calls.append(1)
        raise Fatal("no")

    with pytest.raises(GaveUp) as caught:
        _run(attempt, on_retry=lambda err, delay: retries.append(delay))
    assert isinstance(caught.value.err, Fatal) and not caught.value.deadline_passed
    assert calls == [1] and retries == []


def test_the_deadline_is_respected():
    """The streak ends at the first failure past the deadline, counted from its first failure."""
    clock = FakeClock(0.0)
    calls = []

    async def attempt(budget):
        calls.append(clock())
        clock.advance(0.05)  # each attempt takes 50 ms
        raise Transient("down")

    with pytest.raises(GaveUp) as caught:
        _run(attempt, dataclasses.replace(POLICY, clock=clock))
    assert caught.value.deadline_passed and isinstance(caught.value.err, Transient)
    # The first failure at 0.05 s starts the 0.2 s deadline: the one at 0.25 s is the last.
    assert calls == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])


def test_progress_resets_the_deadline():
    """Each attempt gets somewhere before failing: the streak never reaches the deadline."""
    clock = FakeClock(0.0)
    calls = []
    policy = RetryPolicy(deadline=0.1, initial_backoff=0.005, max_backoff=0.01, clock=clock)

    def attempt_making_progress(reset: bool):
        async def attempt(budget):
            calls.append(1)
            clock.advance(0.03)  # each attempt runs 30 ms before it breaks
            if reset:
                budget.reset()  # some bytes arrived before the break
            if len(calls) < 8:
                raise Transient("broke")
            return "done"
        return attempt

    assert _run(attempt_making_progress(True), policy) == "done"
    assert clock() > policy.deadline * 2  # longer than one streak may last
    calls.clear()
    with pytest.raises(GaveUp) as caught:  # the same failures without progress give up
        _run(attempt_making_progress(False), policy)
    assert caught.value.deadline_passed and len(calls) == 5  # failures at 0.03 (the streak's start) ... 0.15


def test_while_the_service_is_unreachable_a_retry_waits_for_it_not_for_a_backoff():
    """A retry goes out as soon as the connection is back (not after a backoff
    of up to max_backoff), and a connection that stays down ends the streak at
    the deadline, not later."""
    clock = FakeClock(0.0)
    back_at = 0.3
    waits = []

    async def reconnected(timeout: float) -> bool:
        waits.append(timeout)
        if clock() >= back_at:
            return False  # connected: retries back off as usual
        clock.advance(min(timeout, back_at - clock()))  # the wait ends when the service is back
        return True

    policy = RetryPolicy(deadline=5.0, initial_backoff=0.01, max_backoff=2.0, reconnected=reconnected, clock=clock)
    calls = []

    async def attempt(budget):
        calls.append(clock())
        if calls[-1] < back_at:
            raise Transient("connection refused")
        return "ok"

    assert _run(attempt, policy) == "ok"
    assert calls == [0.0, back_at], "the retry goes out when the service is back"
    assert waits == [policy.deadline]

    async def never_back(timeout: float) -> bool:
        clock.advance(timeout)
        return True

    never = RetryPolicy(deadline=0.3, initial_backoff=0.01, max_backoff=2.0, reconnected=never_back, clock=clock)
    started = clock()
    with pytest.raises(GaveUp) as caught:
        _run(lambda budget: _fail(Transient("connection refused")), never)
    assert caught.value.deadline_passed
    assert clock() - started == pytest.approx(never.deadline)


async def _fail(err: BaseException):
    raise err


def test_a_connected_service_that_fails_calls_gets_the_usual_backoff():
    delays = []

    async def reconnected(timeout: float) -> bool:
        return False

    policy = RetryPolicy(deadline=0.2, initial_backoff=0.01, max_backoff=0.02, reconnected=reconnected)
    with pytest.raises(GaveUp):
        _run(lambda budget: _fail(Transient("unavailable")), policy, on_retry=lambda err, delay: delays.append(delay))
    assert len(delays) > 3  # paced by the backoff: a busy loop would try thousands of times
    assert len(delays) < 100


def test_cancellation_is_not_retried():
    async def main():
        started = asyncio.Event()

        async def attempt(budget):
            started.set()
            await asyncio.Event().wait()  # until cancelled

        task = asyncio.create_task(retry_call(POLICY, attempt, retryable=lambda err: True, give_up=GaveUp))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def _rpc_error(code: grpc.StatusCode, details: str = "x") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def test_final_error_uses_the_one_errno_map():
    stale = final_error(_rpc_error(grpc.StatusCode.NOT_FOUND), "read 'a'", object_name="a", pinned_generation=True)
    assert stale.errno == errno.ESTALE and stale.object_name == "a"
    assert final_error(_rpc_error(grpc.StatusCode.NOT_FOUND), "stat 'a'").errno == errno.ENOENT
    assert final_error(_rpc_error(grpc.StatusCode.FAILED_PRECONDITION), "write 'a'").errno == errno.ESTALE
    late = final_error(_rpc_error(grpc.StatusCode.UNAVAILABLE, "gone"), "read 'a'", deadline_passed=True)
    assert late.errno == errno.EIO and late.code is StorageCode.UNAVAILABLE
    assert str(late) == "read 'a': retry deadline exceeded (UNAVAILABLE: gone)"
    assert final_error(ValueError("odd"), "read 'a'").errno == errno.EIO
    original = StorageError("mine", errno_=errno.EBADF)
    assert final_error(original, "read 'a'") is original
    assert is_retryable(_rpc_error(grpc.StatusCode.UNAVAILABLE))
    assert not is_retryable(_rpc_error(grpc.StatusCode.ABORTED))  # a conflict, not a redirect


# -- a refused call gets fresh credentials once -------------------------------------------------------


class Refused(Exception):
    pass


class FakeTokens:
    """Credentials as serial numbers; ``renew`` hands out the next one (or fails with ``failure``)."""

    def __init__(self, failure: str | None = None) -> None:
        self.serial = 1
        self.renewed: list[int] = []
        self.failure = failure

    async def renew(self, refused: int, timeout: float) -> str | None:
        self.renewed.append(refused)
        if self.failure is not None:
            return self.failure
        if self.serial <= refused:
            self.serial += 1
        return None

    def policy(self) -> RetryPolicy:
        reauth = Reauth(refused=lambda err: isinstance(err, Refused), in_use=lambda: self.serial,
                        renew=self.renew)
        return RetryPolicy(deadline=0.2, initial_backoff=0.01, max_backoff=0.02, reauth=reauth)


def test_a_refused_call_is_retried_once_with_fresh_credentials():
    tokens = FakeTokens()
    carried = []

    async def attempt(budget):
        carried.append(tokens.serial)
        if tokens.serial == 1:
            raise Refused("revoked")
        return "ok"

    assert _run(attempt, tokens.policy()) == "ok"
    assert carried == [1, 2] and tokens.renewed == [1]


def test_fresh_credentials_refused_too_are_final_after_one_renewal():
    tokens = FakeTokens()
    calls = []

    async def attempt(budget):
        calls.append(tokens.serial)
        raise Refused("no")

    with pytest.raises(GaveUp) as caught:
        _run(attempt, tokens.policy())
    assert isinstance(caught.value.err, CredentialsRefused) and "refused too" in caught.value.err.why
    assert calls == [1, 2] and tokens.renewed == [1]


def test_no_fresh_credentials_is_final_with_the_reason():
    tokens = FakeTokens(failure="cannot get an access token: invalid_grant")

    async def attempt(budget):
        raise Refused("no")

    with pytest.raises(GaveUp) as caught:
        _run(attempt, tokens.policy())
    assert caught.value.err.why == "no fresh credentials: cannot get an access token: invalid_grant"


def test_without_reauth_a_refusal_is_final_at_once():
    calls = []

    async def attempt(budget):
        calls.append(1)
        raise Refused("no")

    with pytest.raises(GaveUp) as caught:
        _run(attempt)
    assert isinstance(caught.value.err, Refused) and calls == [1]


def test_a_refusal_asks_for_credentials_newer_than_those_the_stream_was_opened_with():
    tokens = FakeTokens()
    budget = tokens.policy().start()
    budget.attempting()
    opened_with = budget.credentials  # a stream opened with serial 1
    tokens.serial = 2  # a refresh happened meanwhile
    budget.attempting()
    budget.reusing(opened_with)  # the attempt goes on over the old stream
    assert asyncio.run(budget.reauthorize(Refused("revoked"))) is None
    assert tokens.renewed == [1] and tokens.serial == 2  # serial 2 is newer: no new refresh


def test_progress_allows_another_renewal_later():
    tokens = FakeTokens()
    budget = tokens.policy().start()
    assert asyncio.run(budget.reauthorize(Refused("1"))) is None
    budget.reset()
    budget.attempting()
    assert asyncio.run(budget.reauthorize(Refused("2"))) is None
    assert tokens.renewed == [1, 2]


def test_a_final_refusal_is_eacces_and_says_why():
    class Unauthenticated(grpc.aio.AioRpcError):
        def __init__(self) -> None:
            super().__init__(grpc.StatusCode.UNAUTHENTICATED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                             details="Invalid Credentials")

    error = final_error(CredentialsRefused(Unauthenticated(), "fresh credentials were refused too"), "read 'a'",
                        object_name="a")
    assert error.errno == errno.EACCES and error.code is StorageCode.UNAUTHENTICATED
    assert str(error) == "read 'a' (fresh credentials were refused too): UNAUTHENTICATED: Invalid Credentials"
