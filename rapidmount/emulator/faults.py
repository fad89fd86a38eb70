"""Fault injection, latency and the per-stream bandwidth cap for the
emulator (faults are deterministic with a seed).

Grammar, one spec per ``--fault`` flag (or ``Emulator.add_fault``)::

    SPEC   := KIND [ ":" OPTION { "," OPTION } ]
    OPTION := KEY "=" VALUE

Kinds:

``broken-read:after=BYTES``
    A BidiReadObject/ReadObject stream serves exactly BYTES bytes of object
    data in total, then aborts with UNAVAILABLE (the official client resumes).
    Fires once by default.
``broken-write:after=BYTES``
    A BidiWriteObject/WriteObject stream persists the first BYTES bytes it
    receives, then aborts with UNAVAILABLE. Fires once by default.
``unavailable[:rate=R]``
    A matching call fails with UNAVAILABLE with probability R (default 1).
    Unlimited by default.
``redirect-read[:token=T]``
    Opening a BidiReadObject stream fails with ABORTED carrying a
    BidiReadObjectRedirectedError{routing_token, read_handle}. Until a retry
    presents ``routing_token=T`` in x-goog-request-params, opens of that
    object keep being redirected. Fires once by default.
``redirect-write[:token=T]``
    The same for BidiWriteObject, with BidiWriteObjectRedirectedError
    {routing_token, write_handle, generation}; a new object is created first,
    so the retry appends to it. Fires once by default.
``corrupt-read[:rate=R]``
    A served read chunk carries a wrong crc32c with probability R (default 1).
    Fires once by default.
``outage``
    Every matching call fails with UNAVAILABLE until the faults are cleared.

Options every kind takes:

``count=N`` (or ``count=inf``)
    How many times the fault may fire.
``method=RPC``
    Only calls of that RPC (e.g. ``GetObject``, ``BidiReadObject``).
``object=GLOB``
    Only calls on objects whose name matches the shell-style pattern.

Randomness comes from one ``random.Random`` per spec, seeded from the
emulator seed, the spec's position and its text; the same seed and the same
sequence of calls give the same faults.
"""

from __future__ import annotations

import fnmatch
import math
import random
import threading
from dataclasses import dataclass, field

from rapidmount.shared import wire

from .pacing import check_bandwidth

FAULT_KINDS = ("broken-read", "broken-write", "unavailable", "redirect-read", "redirect-write",
               "corrupt-read", "outage")
_DEFAULT_COUNT = {"unavailable": math.inf, "outage": math.inf}
_ALLOWED_OPTIONS = {
    "broken-read": {"after"},
    "broken-write": {"after"},
    "unavailable": {"rate"},
    "redirect-read": {"token"},
    "redirect-write": {"token"},
    "corrupt-read": {"rate"},
    "outage": set(),
}
_COMMON_OPTIONS = {"count", "method", "object"}
# RPCs each kind can act on; a method= filter must name one of them.
_STREAM_METHODS = {
    "broken-read": {"BidiReadObject", "ReadObject"},
    "broken-write": {"BidiWriteObject", "WriteObject"},
    "redirect-read": {"BidiReadObject"},
    "redirect-write": {"BidiWriteObject"},
    "corrupt-read": {"BidiReadObject", "ReadObject"},
}


_KNOWN_METHODS = frozenset(wire.STORAGE_METHODS) | frozenset(wire.CONTROL_METHODS)


class FaultSpecError(ValueError):
    """A fault spec that does not follow the grammar."""


@dataclass
class FaultSpec:
    text: str
    kind: str
    remaining: float
    after: int | None = None
    rate: float = 1.0
    token: str | None = None
    method: str | None = None
    object_pattern: str | None = None
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def matches(self, method: str, object_name: str | None) -> bool:
        if self.remaining <= 0:
            return False
        if self.method is not None and self.method != method:
            return False
        if self.object_pattern is not None:
            return object_name is not None and fnmatch.fnmatchcase(object_name, self.object_pattern)
        return True


def parse_fault(text: str) -> FaultSpec:
    """Parse one spec; raises FaultSpecError with a message fit for a user."""
    kind, _, options_text = text.strip().partition(":")
    kind = kind.strip()
    if kind not in FAULT_KINDS:
        raise FaultSpecError(f"unknown fault kind {kind!r} in {text!r}; known kinds: {', '.join(FAULT_KINDS)}")
    options: dict[str, str] = {}
    if options_text.strip():
        for item in options_text.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value:
                raise FaultSpecError(f"fault option {item.strip()!r} in {text!r} is not KEY=VALUE")
            if key not in _ALLOWED_OPTIONS[kind] | _COMMON_OPTIONS:
                allowed = ", ".join(sorted(_ALLOWED_OPTIONS[kind] | _COMMON_OPTIONS))
                raise FaultSpecError(f"fault {kind!r} takes no option {key!r} (options: {allowed})")
            if key in options:
                raise FaultSpecError(f"fault option {key!r} given twice in {text!r}")
            options[key] = value
    spec = FaultSpec(text=text.strip(), kind=kind, remaining=_DEFAULT_COUNT.get(kind, 1))
    if "count" in options:
        spec.remaining = _parse_count(options["count"], text)
    if kind in ("broken-read", "broken-write"):
        if "after" not in options:
            raise FaultSpecError(f"fault {kind!r} needs after=BYTES (e.g. {kind}:after=524288)")
        spec.after = _parse_int(options["after"], "after", text)
    if "rate" in options:
        spec.rate = _parse_rate(options["rate"], text)
    spec.token = options.get("token")
    spec.method = options.get("method")
    if spec.method is not None and spec.method not in _KNOWN_METHODS:
        raise FaultSpecError(f"method={spec.method} in {text!r} is not an RPC this emulator serves "
                             f"({', '.join(sorted(_KNOWN_METHODS))})")
    allowed_methods = _STREAM_METHODS.get(kind)
    if spec.method is not None and allowed_methods is not None and spec.method not in allowed_methods:
        raise FaultSpecError(f"fault {kind!r} applies to {', '.join(sorted(allowed_methods))}, "
                             f"not method={spec.method}")
    spec.object_pattern = options.get("object")
    return spec


def _parse_int(value: str, key: str, text: str) -> int:
    try:
        number = int(value, 0)
    except ValueError:
        raise FaultSpecError(f"{key}={value!r} in {text!r} is not an integer") from None
    if number < 0:
        raise FaultSpecError(f"{key}={value!r} in {text!r} must not be negative")
    return number


def _parse_count(value: str, text: str) -> float:
    if value in ("inf", "unlimited"):
        return math.inf
    count = _parse_int(value, "count", text)
    if count == 0:
        raise FaultSpecError(f"count=0 in {text!r} would never fire; use count=inf for unlimited")
    return count


def _parse_rate(value: str, text: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        raise FaultSpecError(f"rate={value!r} in {text!r} is not a number") from None
    if not 0.0 <= rate <= 1.0:
        raise FaultSpecError(f"rate={value!r} in {text!r} must be between 0 and 1")
    return rate


class Faults:
    """The live fault set plus the latency and stream bandwidth settings; thread-safe.

    Every ``claim_*`` method consumes one firing of the first matching spec.
    """

    def __init__(self, seed: int = 0, latency_ms: float = 0.0,
                 stream_bandwidth: float | None = None) -> None:
        self._seed = seed
        self._lock = threading.Lock()
        self._specs: list[FaultSpec] = []
        self._added = 0
        self._issued_tokens = 0
        # (kind, bucket, object) -> routing token a retry must present.
        self._pending_redirects: dict[tuple[str, str, str], str] = {}
        self._routes: set[str] = set()  # routing tokens given out
        self.latency_ms = latency_ms
        self.stream_bandwidth = stream_bandwidth

    @property
    def latency_ms(self) -> float:
        return self._latency_s * 1000.0

    @latency_ms.setter
    def latency_ms(self, value: float) -> None:
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"latency must be a non-negative number of milliseconds, not {value}")
        self._latency_s = value / 1000.0

    @property
    def latency_s(self) -> float:
        return self._latency_s

    @property
    def stream_bandwidth(self) -> float | None:
        """Each read stream's cap in bytes per second, or None for no cap
        (``--stream-bandwidth``; see ``rapidmount.emulator.pacing``)."""
        return self._stream_bandwidth

    @stream_bandwidth.setter
    def stream_bandwidth(self, value: float | None) -> None:
        self._stream_bandwidth = check_bandwidth(value)

    def add(self, spec: str | FaultSpec) -> FaultSpec:
        parsed = parse_fault(spec) if isinstance(spec, str) else spec
        with self._lock:
            parsed.rng = random.Random(f"{self._seed}/{self._added}/{parsed.text}")
            self._added += 1
            self._specs.append(parsed)
        return parsed

    def clear(self) -> None:
        with self._lock:
            self._specs.clear()
            self._pending_redirects.clear()
            self._added = 0

    def _claim(self, kinds: tuple[str, ...], method: str, object_name: str | None,
               use_rate: bool = False) -> FaultSpec | None:
        # Caller holds the lock.
        for spec in self._specs:
            if spec.kind in kinds and spec.matches(method, object_name):
                if use_rate and spec.rate < 1.0 and spec.rng.random() >= spec.rate:
                    continue
                spec.remaining -= 1
                return spec
        return None

    def claim_call_failure(self, method: str, object_name: str | None = None) -> str | None:
        """The UNAVAILABLE message for this call, or None to let it through."""
        with self._lock:
            spec = self._claim(("outage",), method, object_name)
            if spec is None:
                spec = self._claim(("unavailable",), method, object_name, use_rate=True)
            return f"injected fault {spec.text!r}: service unavailable" if spec else None

    def claim_break(self, kind: str, method: str, object_name: str | None,
                    done: int, length: int) -> int | None:
        """For ``broken-read``/``broken-write``: if the stream, having moved
        ``done`` bytes, must break within the next ``length`` bytes, how many
        of them to move first."""
        with self._lock:
            for spec in self._specs:
                if (spec.kind == kind and spec.matches(method, object_name)
                        and spec.after is not None and done <= spec.after < done + max(length, 1)):
                    spec.remaining -= 1
                    return spec.after - done
        return None

    def claim_corruption(self, method: str, object_name: str | None) -> bool:
        with self._lock:
            return self._claim(("corrupt-read",), method, object_name, use_rate=True) is not None

    def pending_redirect(self, kind: str, bucket: str, object_name: str,
                         presented_token: str | None) -> str | None:
        """An earlier redirect's token this open must present; None once it did."""
        key = (kind, bucket, object_name)
        with self._lock:
            token = self._pending_redirects.get(key)
            if token is None or token == presented_token:
                self._pending_redirects.pop(key, None)
                return None
            return token

    def claim_redirect(self, kind: str, method: str, bucket: str, object_name: str) -> str | None:
        """A fresh routing token if this open must be redirected."""
        with self._lock:
            spec = self._claim((f"redirect-{kind}",), method, object_name)
            if spec is None:
                return None
            self._issued_tokens += 1
            token = spec.token or f"{kind}-route-{self._issued_tokens}"
            self._pending_redirects[(kind, bucket, object_name)] = token
            self._routes.add(token)
            return token

    def follows_redirect(self, presented_token: str | None) -> bool:
        """The open presents a routing token this emulator gave: it is not redirected again."""
        with self._lock:
            return bool(presented_token) and presented_token in self._routes
