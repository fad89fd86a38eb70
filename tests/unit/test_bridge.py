"""The trio ↔ asyncio bridge: results, errors and cancellation both ways."""

from __future__ import annotations

import asyncio

import pytest
import trio

from rapidmount.bridge import BridgeClosed


async def _add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


async def _fail() -> None:
    raise ValueError("boom")


def test_call_returns_result_and_raises_errors(bridge):
    async def main():
        assert await bridge.call(_add, 2, 3) == 5
        with pytest.raises(ValueError, match="boom"):
            await bridge.call(_fail)
        results = []
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(lambda i=i: _collect(results, i))
        assert sorted(results) == [i * 2 for i in range(50)]

    async def _collect(results, i):
        results.append(await bridge.call(_add, i, i))

    trio.run(main)


def test_trio_cancellation_cancels_the_asyncio_side(bridge):
    states = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            states.append("asyncio-cancelled")
            raise

    async def main():
        with trio.move_on_after(0.2) as scope:
            await bridge.call(slow)
        assert scope.cancelled_caught

    trio.run(main)
    # The asyncio task saw the cancellation before trio moved on.
    assert states == ["asyncio-cancelled"]


def test_stop_fails_pending_calls(bridge):
    async def forever() -> None:
        await asyncio.sleep(3600)

    async def main():
        async with trio.open_nursery() as nursery:
            async def stopper():
                await trio.sleep(0.1)
                await trio.to_thread.run_sync(bridge.stop)
            nursery.start_soon(stopper)
            with pytest.raises(BridgeClosed):
                await bridge.call(forever)

    trio.run(main)
    with pytest.raises(BridgeClosed):
        bridge.submit(_add, 1, 2)


def test_run_blocking_outside_trio(bridge):
    assert bridge.run_blocking(_add, 20, 22, timeout=5) == 42
