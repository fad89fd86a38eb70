"""The one retry policy: a deadline, exponential backoff with full jitter.

Every retry loop of the mount (unary calls, uploads, read and write
streams) draws its delays from a :class:`RetryBudget` of this policy. What
counts as retryable is the storage implementation's call
(``rapidmount.client.errors.is_retryable`` for gRPC).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

__all__ = ["RetryBudget", "RetryPolicy"]


@dataclass
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by a deadline.

    The deadline runs from the first failure of a streak; progress resets it.
    """

    deadline: float = 30.0
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def start(self) -> "RetryBudget":
        return RetryBudget(self)


class RetryBudget:
    """One streak of retries under a :class:`RetryPolicy`."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._started: float | None = None
        self._backoff = policy.initial_backoff

    def reset(self) -> None:
        """Progress was made: the next failure starts a fresh streak."""
        self._started = None
        self._backoff = self._policy.initial_backoff

    def next_delay(self) -> float | None:
        """Seconds to wait before retrying, or None once the deadline has passed."""
        now = time.monotonic()
        if self._started is None:
            self._started = now
        remaining = self._started + self._policy.deadline - now
        if remaining <= 0:
            return None
        delay = random.uniform(0, self._backoff)
        self._backoff = min(self._backoff * self._policy.multiplier, self._policy.max_backoff)
        return min(delay, remaining)
