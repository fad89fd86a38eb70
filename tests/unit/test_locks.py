"""QuickLock: a free lock is taken without a checkpoint; a held one is waited
for, first come first served, as trio's own."""

from __future__ import annotations

import trio
import trio.testing

from rapidmount.core.locks import QuickLock


def test_a_free_lock_is_taken_without_a_checkpoint():
    async def main():
        lock = QuickLock()
        with trio.testing.assert_no_checkpoints():
            async with lock:
                assert lock.locked()
        assert not lock.locked()

    trio.run(main)


def test_a_held_lock_is_waited_for_in_order_and_never_overtaken():
    async def main():
        lock = QuickLock()
        order = []

        async def one(name: str) -> None:
            async with lock:
                order.append(name)
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            await lock.__aenter__()
            for name in "abc":
                nursery.start_soon(one, name)
                await trio.testing.wait_all_tasks_blocked()
            await lock.__aexit__(None, None, None)
            # Released to "a": a newcomer arriving now waits behind "b" and "c".
            nursery.start_soon(one, "late")
        assert order == ["a", "b", "c", "late"]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # the holders' sleeps take no real time
