"""Several read streams per open file: the choice alone (StreamPolicy), without I/O."""

from __future__ import annotations

import pytest

from rapidmount.dataplane.streams import DEFAULT_MAX_BYTES, DEFAULT_MAX_RANGES, DEFAULT_SPAN, StreamPolicy

MiB = 1 << 20

def test_defaults_are_two_ranges_or_eight_mib_and_a_span_of_32_mib():
    assert (DEFAULT_MAX_RANGES, DEFAULT_MAX_BYTES, DEFAULT_SPAN) == (2, 8 * MiB, 32 * MiB)
    policy = StreamPolicy(4)
    assert (policy.max_ranges, policy.max_bytes, policy.span) == (2, 8 * MiB, 32 * MiB)


def test_the_first_range_goes_to_the_first_stream():
    policy = StreamPolicy(4)
    assert policy.choose([]) == 0
    assert policy.choose([(0, 0)]) == 0  # an idle first stream takes it: nothing opens early


def test_a_new_stream_opens_only_when_every_stream_is_loaded():
    policy = StreamPolicy(4, max_ranges=2, max_bytes=8 * MiB, span=0)
    assert policy.choose([(1, 2 * MiB)]) == 0            # under both thresholds
    assert policy.choose([(2, 4 * MiB)]) == 1            # 2 ranges in flight: open another
    assert policy.choose([(1, 8 * MiB)]) == 1            # 8 MiB in flight: open another
    assert policy.choose([(2, 4 * MiB), (1, 2 * MiB)]) == 1  # the second has room
    assert policy.choose([(2, 4 * MiB), (2, 4 * MiB)]) == 2


def test_up_to_the_limit_then_the_least_loaded():
    policy = StreamPolicy(3, span=0)
    loads = [(3, 6 * MiB), (2, 4 * MiB), (4, 8 * MiB)]
    assert policy.choose(loads) == 1  # all loaded, at the limit: fewest bytes
    assert policy.choose([(2, 4 * MiB), (3, 4 * MiB), (2, 4 * MiB)]) == 0  # ties: fewer ranges, then the oldest
    assert policy.choose([(5, 1 * MiB), (1, 2 * MiB), (9, 9 * MiB)]) == 0  # bytes first


def test_a_stream_more_opens_only_a_span_further_into_the_object():
    """Stream k opens only for a range at least k spans in: a 16 MiB file is
    read on one stream, a large one gains a stream every 32 MiB."""
    policy = StreamPolicy(4)
    loaded = (2, 8 * MiB)
    assert policy.choose([loaded], 14 * MiB) == 0               # a short file: one stream, however loaded
    assert policy.choose([loaded], 32 * MiB) == 1
    assert policy.choose([loaded, loaded], 40 * MiB) == 0       # the second stream is the last before 64 MiB
    assert policy.choose([loaded, loaded], 64 * MiB) == 2
    assert policy.choose([loaded] * 4, 1 << 30) == 0            # the limit still holds
    assert policy.choose([(0, 0)], 1 << 30) == 0                # and an idle stream still takes it


def test_one_stream_never_opens_another():
    policy = StreamPolicy(1)
    assert policy.choose([(100, 1 << 30)]) == 0


def test_least_loaded():
    assert StreamPolicy.least_loaded([(5, 10 * MiB)]) == 0
    assert StreamPolicy.least_loaded([(5, 10 * MiB), (3, 6 * MiB), (1, 6 * MiB)]) == 2


def test_policy_rejects_nonsense():
    for args in ((0,), (2, 0, 1), (2, 1, 0)):
        with pytest.raises(ValueError):
            StreamPolicy(args[0], max_ranges=args[1] if len(args) > 1 else 2,
                         max_bytes=args[2] if len(args) > 2 else 1)
    with pytest.raises(ValueError):
        StreamPolicy(2, span=-1)
