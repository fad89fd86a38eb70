"""A clock that moves only when a test moves it, for code that takes a
``clock`` (seconds, as ``time.monotonic``): TTLs, retry deadlines, token
lifetimes are then checked exactly, without waiting for them."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
