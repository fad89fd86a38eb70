"""Split a listing's key space into ranges and rebalance them (sans-I/O).

A :class:`RangePlan` hands key ranges ``[start, end)`` to a pool of
workers that list them with ListObjects' ``lexicographic_start`` /
``lexicographic_end``. A worker with nothing left steals the upper part of
the widest range known to hold more keys: the split point lies strictly between the last key that
range listed and its end, so every key is listed exactly once whatever the
timing of splits and pages.

Split points in an unknown key space come from :func:`midpoint`, which
interpolates over the characters actually seen in keys (object names use
a small alphabet, usually digits, letters, ``/``, ``_``, ``-`` and ``.``),
so a split lands where keys are likely, not somewhere in the vast empty
space of Unicode.

Keys are compared as Python strings (code point order), which is UTF-8
byte order: the order the server lists in.
"""

from __future__ import annotations

import bisect
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Coverage", "KeyRange", "RangePlan", "midpoint", "choose_boundaries", "prefix_end"]

_DEFAULT_ALPHABET = sorted(set(string.digits + string.ascii_letters + "-._/"))
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)
_WIDTH_DEPTH = 4  # characters compared when sizing a range
_MAX_SPLIT_DEPTH = 12


def _char_after(char: str) -> str | None:
    code = ord(char) + 1
    if code in _SURROGATES:
        code = _SURROGATES.stop
    return chr(code) if code <= _MAX_CODE_POINT else None


def prefix_end(prefix: str) -> str | None:
    """The smallest key above every key that starts with ``prefix`` (None: no bound)."""
    while prefix:
        above = _char_after(prefix[-1])
        if above is not None:
            return prefix[:-1] + above
        prefix = prefix[:-1]
    return None


def _digits(text: str, depth: int, alphabet: Sequence[str]) -> int:
    """``text``'s first ``depth`` characters as a number in base len(alphabet)+2.

    Digit 0 is "the string ended"; a character maps to its rank in the
    alphabet plus one (characters outside it to their insertion rank).
    """
    base = len(alphabet) + 2
    value = 0
    for position in range(depth):
        digit = bisect.bisect_left(alphabet, text[position]) + 1 if position < len(text) else 0
        value = value * base + digit
    return value


def _text(value: int, depth: int, alphabet: Sequence[str]) -> str | None:
    base = len(alphabet) + 2
    digits = []
    for _ in range(depth):
        value, digit = divmod(value, base)
        digits.append(digit)
    chars = []
    for digit in reversed(digits):
        if digit == 0:
            break
        if digit <= len(alphabet):
            chars.append(alphabet[digit - 1])
        else:
            above = _char_after(alphabet[-1])
            if above is None:
                return None
            chars.append(above)
    return "".join(chars)


def _common_prefix_length(a: str, b: str) -> int:
    limit = min(len(a), len(b))
    index = 0
    while index < limit and a[index] == b[index]:
        index += 1
    return index


def midpoint(low: str, high: str | None, alphabet: Sequence[str] = _DEFAULT_ALPHABET,
             floor: int = 0) -> str | None:
    """A key ``m`` with ``low < m < high`` (``high`` None: unbounded), near the middle.

    The middle is taken over ``alphabet`` (sorted, unique characters) after
    the common prefix of ``low`` and ``high`` (or after ``low[:floor]`` when
    ``high`` is None). None when no such key is found, e.g. ``high`` is
    ``low + "\\x00"``.
    """
    if not alphabet:
        alphabet = _DEFAULT_ALPHABET
    if high is not None and not low < high:
        return None
    shared = _common_prefix_length(low, high) if high is not None else min(floor, len(low))
    head, low_rest = low[:shared], low[shared:]
    high_rest = high[shared:] if high is not None else None
    base = len(alphabet) + 2
    for depth in range(1, _MAX_SPLIT_DEPTH + 1):
        low_value = _digits(low_rest, depth, alphabet)
        high_value = base ** depth if high_rest is None else _digits(high_rest, depth, alphabet)
        if high_value - low_value < 2:
            continue
        tail = _text((low_value + high_value) // 2, depth, alphabet)
        if tail is None:
            continue
        candidate = head + tail
        if low < candidate and (high is None or candidate < high):
            return candidate
    return None


def choose_boundaries(sample: Iterable[str], count: int) -> list[str]:
    """Up to ``count`` split keys spread evenly over a sorted sample of keys.

    The sample is what one delimited listing page of the root returned
    (top-level directories and files), so ranges start at directory
    boundaries.
    """
    keys = sorted(set(sample))
    if count <= 0 or not keys:
        return []
    if len(keys) <= count:
        return keys
    step = len(keys) / (count + 1)  # count cuts make count + 1 parts
    return sorted({keys[int((index + 1) * step)] for index in range(count)})


class Coverage:
    """Listed key intervals ``[low, high)``, merged, for fast containment tests."""

    def __init__(self, spans: Iterable[tuple[str, str | None]]) -> None:
        self._lows: list[str] = []
        self._highs: list[str | None] = []
        for low, high in sorted(spans, key=lambda span: span[0]):
            if high is not None and high <= low:
                continue
            last_high = self._highs[-1] if self._highs else ""
            if self._highs and (last_high is None or low <= last_high):
                if last_high is not None and (high is None or high > last_high):
                    self._highs[-1] = high
            else:
                self._lows.append(low)
                self._highs.append(high)

    def covers(self, low: str, high: str | None) -> bool:
        """Whether ``[low, high)`` lies inside one listed interval."""
        index = bisect.bisect_right(self._lows, low) - 1
        if index < 0:
            return False
        end = self._highs[index]
        return end is None or (high is not None and high <= end)


@dataclass
class KeyRange:
    """One range of the key space: keys ``start <= k < end`` (end None: no bound)."""

    id: int
    start: str
    end: str | None
    last_key: str | None = None  # the greatest key listed so far
    assigned: bool = False
    done: bool = False
    pages: int = 0
    listed: int = 0
    more: bool = False  # its last page said more keys follow: worth stealing from

    def next_start(self) -> str:
        """Where the next page starts: just after the last key listed."""
        return self.start if self.last_key is None else self.last_key + "\x00"


class RangePlan:
    """Ranges of ``[start, end)`` and who lists them; work stealing on demand.

    A worker calls :meth:`assign` for a range, then for each page
    :meth:`request` (the bounds to ask for) and :meth:`page_done` (the keys
    that came back); a page in flight may return keys a thief took
    meanwhile, and :meth:`page_done` drops those.
    """

    def __init__(self, start: str = "", end: str | None = None, boundaries: Iterable[str] = (),
                 *, alphabet: Iterable[str] = ()) -> None:
        self.floor = len(start)  # keys all share the listed prefix
        cuts = sorted({key for key in boundaries if key > start and (end is None or key < end)})
        ends: list[str | None] = [*cuts, end]
        self.ranges: list[KeyRange] = [KeyRange(index, lower, upper)
                                       for index, (lower, upper) in enumerate(zip([start, *cuts], ends))]
        self.steals = 0
        seen = set(alphabet)
        for key in cuts:
            seen.update(key[self.floor:])
        self._alphabet: list[str] = sorted(seen)

    # -- the workers' side ----------------------------------------------------

    def assign(self) -> KeyRange | None:
        """A range for an idle worker: an unassigned one, else a piece of the
        widest busy range. None when nothing can be handed out right now."""
        for key_range in self.ranges:
            if not key_range.assigned and not key_range.done:
                key_range.assigned = True
                return key_range
        return self._steal()

    def request(self, key_range: KeyRange) -> tuple[str, str | None] | None:
        """(lexicographic_start, lexicographic_end) of the range's next page,
        or None when the range is done (a thief may have left it empty)."""
        start = key_range.next_start()
        if key_range.done or (key_range.end is not None and start >= key_range.end):
            key_range.done = True
            return None
        return start, key_range.end

    def page_done(self, key_range: KeyRange, keys: Sequence[str], truncated: bool) -> list[str]:
        """Record a page (keys in order); returns the keys this range owns.

        ``truncated``: the server has more keys below the end the page was
        requested with. The range is done when the page ran past the
        range's (possibly reduced) end, or nothing more is left.
        """
        key_range.pages += 1
        owned = list(keys)
        if key_range.end is not None:
            cut = bisect.bisect_left(owned, key_range.end)
            if cut < len(owned):
                del owned[cut:]
                truncated = False  # everything below the end came back
        if owned:
            key_range.last_key = owned[-1]
            key_range.listed += len(owned)
            self._observe(owned)
        if not truncated or (key_range.end is not None and key_range.next_start() >= key_range.end):
            key_range.done = True
        key_range.more = not key_range.done
        return owned

    def covers(self, low: str, high: str | None) -> bool:
        """Whether every key in ``[low, high)`` has been listed already
        (high None: no upper bound)."""
        return self.coverage().covers(low, high)

    def coverage(self) -> Coverage:
        """A snapshot of what is listed, for many :meth:`Coverage.covers` queries."""
        spans: list[tuple[str, str | None]] = []
        for key_range in self.ranges:
            if key_range.done:
                spans.append((key_range.start, key_range.end))
            elif key_range.last_key is not None:
                spans.append((key_range.start, key_range.last_key + "\x00"))
        return Coverage(spans)

    # -- state ------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return all(key_range.done for key_range in self.ranges)

    @property
    def busy(self) -> int:
        return sum(1 for key_range in self.ranges if key_range.assigned and not key_range.done)

    @property
    def listed(self) -> int:
        return sum(key_range.listed for key_range in self.ranges)

    @property
    def alphabet(self) -> list[str]:
        return self._alphabet or _DEFAULT_ALPHABET

    # -- internals ----------------------------------------------------------------

    def _observe(self, keys: Sequence[str]) -> None:
        seen = set("".join(key[self.floor:] for key in keys))
        if not seen.issubset(self._alphabet):
            self._alphabet = sorted(seen.union(self._alphabet))

    def _width(self, key_range: KeyRange) -> int:
        """Rough size of what is left of a range, in alphabet space."""
        alphabet = self.alphabet
        low = key_range.last_key if key_range.last_key is not None else key_range.start
        base = len(alphabet) + 2
        high = base ** _WIDTH_DEPTH if key_range.end is None else \
            _digits(key_range.end[self.floor:], _WIDTH_DEPTH, alphabet)
        return high - _digits(low[self.floor:], _WIDTH_DEPTH, alphabet)

    def _steal(self) -> KeyRange | None:
        # Only ranges known to hold more keys: splitting space nobody has
        # seen a key in would go on forever in an empty key space.
        busy = [r for r in self.ranges if r.assigned and not r.done and r.more]
        busy.sort(key=self._width, reverse=True)
        for victim in busy:
            low = victim.last_key if victim.last_key is not None else victim.start
            split = midpoint(low, victim.end, self.alphabet, self.floor)
            if split is None or split <= victim.next_start():
                continue  # the victim keeps a non-empty part
            stolen = KeyRange(len(self.ranges), split, victim.end, assigned=True)
            victim.end = split
            self.ranges.append(stolen)
            self.steals += 1
            return stolen
        return None
