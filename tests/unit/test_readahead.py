"""Unit tests for the per-handle readahead policy (rapidmount.readahead.policy)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidmount.readahead import ReadaheadPolicy, ReadPlan

BS = 100
SIZE = 10_000  # file size: 100 blocks


def policy(**kw) -> ReadaheadPolicy:
    kw.setdefault("sequential_slack", 50)
    return ReadaheadPolicy(BS, 200, 800, **kw)


def seq(demand: tuple[int, int], prefetch: tuple[int, int] = (0, 0)) -> ReadPlan:
    return ReadPlan(True, range(*demand), None, range(*prefetch))


def direct(offset: int, length: int) -> ReadPlan:
    return ReadPlan(False, range(0), (offset, length), range(0))


EMPTY_SEQ = ReadPlan(True, range(0), None, range(0))

# Each case: a list of (offset, size, expected plan, window after the read).
CASES = {
    "sequential from zero, window doubles to max": [
        (0, 50, seq((0, 1), (1, 3)), 400),  # prefetch up to ceil((50+200)/100)
        (50, 50, seq((0, 1), (3, 5)), 800),  # up to ceil((100+400)/100)
        (100, 100, seq((1, 2), (5, 10)), 800),  # up to ceil((200+800)/100), window capped
        (200, 100, seq((2, 3), (10, 11)), 800),
        (300, 100, seq((3, 4), (11, 12)), 800),  # steady state: one block per block read
    ],
    "random read goes direct and resets the window; two near reads resume": [
        (0, 100, seq((0, 1), (1, 3)), 400),
        (5000, 50, direct(5000, 50), 200),
        (5050, 50, direct(5050, 50), 200),  # one near read is not enough
        (5100, 50, seq((51, 52), (52, 54)), 400),  # second near read: sequential, new run
        (5150, 50, seq((51, 52), (54, 56)), 800),
    ],
    "first read far from zero is random": [
        (7000, 10, direct(7000, 10), 200),
        (9000, 10, direct(9000, 10), 200),
    ],
    "first read within slack of zero is sequential": [
        (30, 20, seq((0, 1), (1, 3)), 400),
    ],
    "kernel reordering within the slack stays sequential and re-issues nothing": [
        (0, 100, seq((0, 1), (1, 3)), 400),
        (120, 30, seq((1, 2), (3, 6)), 800),  # 20 bytes ahead of the previous end
        (100, 20, seq((1, 2), (6, 10)), 800),  # the late one: target from the stream end (150)
        (150, 50, seq((1, 2)), 800),  # up to ceil((200 + 800) / 100): all issued
    ],
    "reads at and past EOF are empty and change nothing": [
        (SIZE, 10, EMPTY_SEQ, 200),
        (SIZE + 500, 10, EMPTY_SEQ, 200),
        (0, 0, EMPTY_SEQ, 200),
        (0, 100, seq((0, 1), (1, 3)), 400),
    ],
    "prefetch is clipped to the file size": [
        (9800, 50, direct(9800, 50), 200),
        (9850, 50, direct(9850, 50), 200),
        (9900, 500, seq((99, 100)), 400),  # demand clipped to EOF, nothing to prefetch
    ],
    "random read clipped at EOF": [
        (0, 10, seq((0, 1), (1, 3)), 400),
        (9990, 50, direct(9990, 10), 200),
    ],
    "large random read uses the cache path without prefetch": [
        (0, 10, seq((0, 1), (1, 3)), 400),
        (5050, 250, ReadPlan(False, range(50, 53), None, range(0)), 200),
    ],
    "resuming at the stream position after a random read re-issues nothing": [
        (0, 100, seq((0, 1), (1, 3)), 400),
        (100, 100, seq((1, 2), (3, 6)), 800),
        (200, 100, seq((2, 3), (6, 11)), 800),
        (9000, 10, direct(9000, 10), 200),  # e.g. a footer
        (300, 100, direct(300, 100), 200),
        (400, 100, direct(400, 100), 200),
        (500, 100, seq((5, 6)), 400),  # back in the old run: nothing to re-issue
        (600, 100, seq((6, 7)), 800),  # up to ceil(700 + 400): still inside the run
        (700, 100, seq((7, 8), (11, 16)), 800),
    ],
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_plans(case: list[tuple[int, int, ReadPlan, int]]) -> None:
    p = policy()
    for i, (offset, size, expected, window) in enumerate(case):
        assert p.plan(offset, size, SIZE) == expected, f"read #{i} at {offset}"
        assert p.window == window, f"window after read #{i}"


def test_second_pass_from_the_start_is_a_new_run() -> None:
    p = policy()
    for offset in range(0, 3000, 100):
        p.plan(offset, 100, SIZE)
    assert p.runs_started == 1 and p.issued == range(0, 38)
    assert p.plan(0, 100, SIZE) == direct(0, 100)
    assert p.plan(100, 100, SIZE) == direct(100, 100)
    # Blocks 3 and 4 were issued by the first pass, long ago: issue them again.
    assert p.plan(200, 100, SIZE) == seq((2, 3), (3, 5))
    assert p.runs_started == 2 and p.issued == range(2, 5)


def test_appended_file_keeps_prefetching() -> None:
    p = policy()
    assert p.plan(0, 100, 300) == seq((0, 1), (1, 3))
    assert p.plan(100, 100, 300) == seq((1, 2))  # prefetch already reached EOF
    assert p.plan(200, 100, 2000) == seq((2, 3), (3, 11))  # the object grew


def test_reset_forgets_history() -> None:
    p = policy()
    p.plan(0, 100, SIZE)
    p.plan(5000, 10, SIZE)
    p.reset()
    assert p.window == 200 and p.sequential and p.runs_started == 0
    assert p.plan(0, 100, SIZE) == seq((0, 1), (1, 3))


def test_resume_after_is_configurable() -> None:
    p = policy(resume_after=1)
    p.plan(0, 100, SIZE)
    assert p.plan(5000, 10, SIZE).direct == (5000, 10)
    assert p.plan(5010, 10, SIZE).sequential


def test_random_limit_is_configurable() -> None:
    p = policy(random_limit=1000)
    p.plan(5000, 10, SIZE)
    assert p.plan(0, 600, SIZE) == direct(0, 600)


def test_zero_window_disables_prefetch() -> None:
    p = ReadaheadPolicy(BS, 0, 0)
    assert [p.plan(o, 100, SIZE) for o in (0, 100)] == [seq((0, 1)), seq((1, 2))]


def test_default_slack_tolerates_kernel_reordering() -> None:
    # 128 KiB requests, one arriving 256 KiB late (kernel worst case).
    kib = 1024
    p = ReadaheadPolicy(1024 * kib, 1024 * kib, 8192 * kib)
    for offset in (0, 128, 384, 512, 256, 640, 768):
        assert p.plan(offset * kib, 128 * kib, 1 << 30).sequential


@pytest.mark.parametrize(
    "args", [(0, 1, 1), (BS, 300, 200), (BS, -1, 10)], ids=["block", "window order", "negative"]
)
def test_rejects_bad_configuration(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        ReadaheadPolicy(*args)


def test_rejects_negative_offset_or_size() -> None:
    with pytest.raises(ValueError):
        policy().plan(-1, 10, SIZE)
    with pytest.raises(ValueError):
        policy().plan(0, -10, SIZE)


reads = st.lists(
    st.tuples(st.integers(0, 3000), st.integers(0, 400)), min_size=1, max_size=40
)


@settings(max_examples=300, deadline=None)
@given(
    reads=reads,
    file_size=st.integers(0, 3000),
    block=st.sampled_from([1, 7, 64, 100, 256]),
    initial=st.integers(0, 300),
    extra=st.integers(0, 1000),
    slack=st.integers(0, 300),
    limit=st.none() | st.integers(0, 500),
)
def test_plans_are_consistent(reads, file_size, block, initial, extra, slack, limit) -> None:
    """For any read sequence: plans stay inside the file, prefetch never
    overlaps this plan's demand or anything issued earlier in the same run,
    and a sequential plan issues at least up to the read end plus the window."""
    p = ReadaheadPolicy(
        block, initial, initial + extra, sequential_slack=slack, random_limit=limit
    )
    nblocks = -(-file_size // block)
    issued: set[int] = set()
    runs = p.runs_started
    for offset, size in reads:
        window = p.window
        plan = p.plan(offset, size, file_size)
        end = min(offset + size, file_size)
        assert set(plan.prefetch).isdisjoint(plan.demand)
        assert plan.prefetch.step == 1 and plan.demand.step == 1
        assert plan.prefetch.stop <= nblocks and plan.demand.stop <= nblocks
        if size == 0 or offset >= file_size:
            assert not plan.demand and not plan.prefetch and plan.direct is None
            continue
        if plan.direct is not None:
            assert not plan.sequential and plan.direct == (offset, end - offset)
            assert not plan.demand and not plan.prefetch
            continue
        # Cache path: the demand blocks cover exactly the requested bytes.
        assert plan.demand.start * block <= offset < end <= plan.demand.stop * block
        assert plan.demand.start * block > offset - block
        if not plan.sequential:
            assert not plan.prefetch
            continue
        if p.runs_started != runs:
            runs, issued = p.runs_started, set()
        assert issued.isdisjoint(plan.prefetch), "prefetch re-issued a block of this run"
        issued.update(plan.prefetch)
        issued.update(plan.demand)
        assert p.issued.stop >= min(-(-(end + window) // block), nblocks)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(-60, 120), st.integers(1, 300)), min_size=1, max_size=60),
    block=st.sampled_from([50, 100, 256]),
)
def test_forward_reader_with_jitter_never_reissues(steps, block) -> None:
    """A reader that moves forward with small jitter is one stream: sequential
    throughout, and no block is ever prefetched twice."""
    p = ReadaheadPolicy(block, 200, 1600, sequential_slack=150)
    issued: list[int] = []
    position = 0
    for jitter, size in steps:
        offset = max(0, position + jitter)
        plan = p.plan(offset, size, 50_000)
        assert plan.sequential
        issued.extend(plan.prefetch)
        position = max(position, offset + size)
    assert len(issued) == len(set(issued))
    assert p.runs_started == 1


# -- with page-cache stores ahead (the kernel serves stored pages without a READ)

def test_stores_ahead_a_jump_inside_the_issued_run_stays_sequential():
    plain, stored = policy(), policy(stores_ahead=True)
    for p in (plain, stored):
        p.plan(0, 100, SIZE)  # issues blocks 0-2
        p.plan(100, 100, SIZE)  # window 400: issues up to block 6
    # The reader read blocks 2-4 from the kernel's page cache: its next READ is at block 5.
    assert plain.plan(500, 100, SIZE).direct == (500, 100)  # without stores: a random jump
    plan = stored.plan(500, 100, SIZE)
    assert plan.sequential and plan.demand == range(5, 6)
    assert plan.prefetch == range(6, 14)  # from the new position: ceil((600 + 800) / 100)


def test_stores_ahead_a_jump_past_the_issued_run_is_random():
    p = policy(stores_ahead=True)
    p.plan(0, 100, SIZE)
    assert p.plan(5000, 100, SIZE).direct == (5000, 100)


def test_stores_ahead_one_tripwire_at_a_time_half_a_window_before_the_run_end():
    p = ReadaheadPolicy(BS, 400, 1600, sequential_slack=50, stores_ahead=True)
    plan = p.plan(0, 100, SIZE)
    assert plan.prefetch == range(1, 5) and plan.tripwire == 3  # half of 400 is two blocks
    # The reader outran the stores: its READ extends the run, the tripwire at block 3 is still ahead.
    plan = p.plan(100, 100, SIZE)
    assert plan.prefetch == range(5, 10) and plan.tripwire == -1
    # The READ of the tripwire page plans the next window, with the next tripwire.
    plan = p.plan(300, 4, SIZE)
    assert plan.sequential and plan.prefetch == range(10, 20) and plan.tripwire == 12
    # Reads between tripwires (stores that lagged) place none; the next tripwire READ does.
    assert p.plan(1000, 100, SIZE).tripwire == -1
    plan = p.plan(1200, 4, SIZE)
    assert plan.sequential and plan.prefetch == range(27, 29) and plan.tripwire == 27


def test_stores_ahead_no_tripwire_once_the_file_end_is_issued():
    p = ReadaheadPolicy(BS, 400, 1600, sequential_slack=50, stores_ahead=True)
    plan = p.plan(0, 100, 500)
    assert plan.prefetch == range(1, 5) and plan.tripwire == -1


def test_without_stores_there_is_no_tripwire():
    assert all(policy().plan(offset, 100, SIZE).tripwire == -1 for offset in range(0, 1000, 100))


# -- whether a handle's stores win the race with its READs

def test_store_tally_pauses_a_reader_whose_reads_beat_the_stores_then_tries_again():
    from rapidmount.readahead import StoreTally

    tally = StoreTally()
    for block in range(StoreTally.SAMPLE):  # a cold dd: every block it asked to store is READ anyway
        assert tally.wants(block)
        tally.asked_for(block)
        tally.read(range(block, block + 1))
    assert tally.pauses == 1
    resume = StoreTally.SAMPLE + StoreTally.PAUSE_BLOCKS
    assert not tally.wants(StoreTally.SAMPLE) and not tally.wants(resume - 1)
    assert tally.wants(resume)


def test_store_tally_keeps_storing_for_a_reader_the_stores_stay_ahead_of():
    from rapidmount.readahead import StoreTally

    tally = StoreTally()
    for block in range(0, 400, 8):  # a READ at each tripwire: the blocks in between were read from stores
        for ahead in range(block, block + 8):
            tally.asked_for(ahead)
        tally.read(range(block + 8, block + 9))
    # Some READs too (the reader outran a lagging store now and then): still far from losing.
    for block in range(400, 440):
        tally.asked_for(block)
        if block % 3 == 0:
            tally.read(range(block, block + 1))
    assert tally.pauses == 0 and tally.wants(10_000)


def _sequential_prefetches(p: ReadaheadPolicy, size: int, read: int, file_size: int) -> list[range]:
    return [plan.prefetch for plan in (p.plan(offset, read, file_size) for offset in range(0, size, read))
            if plan.prefetch]


def test_steps_issue_several_blocks_at_once_and_the_same_blocks_in_all():
    """With steps of 4 blocks, a steady reader's prefetch comes 4 blocks at a
    time (one fetch call each), and the blocks issued are those of step 1."""
    one = _sequential_prefetches(policy(), SIZE, 50, SIZE)
    four = _sequential_prefetches(policy(step_blocks=4), SIZE, 50, SIZE)
    flat = [block for run in one for block in run]
    assert flat == [block for run in four for block in run] == list(range(1, 100))
    # After the window's first doublings (steps are at most half of it).
    assert [len(run) for run in four[3:-1]] == [4] * (len(four) - 4) and len(four) < len(one) / 3
    assert max(len(run) for run in one[3:]) == 1  # one block per read without steps


def test_steps_are_at_most_half_the_window_so_a_first_read_runs_ahead():
    # Window 200 (2 blocks): the step is 1 block, whatever step_blocks says.
    assert policy(step_blocks=8).plan(0, 50, SIZE) == seq((0, 1), (1, 3))


def test_steps_issue_the_last_blocks_of_the_file_even_when_fewer():
    p = policy(step_blocks=4)
    issued = [block for run in _sequential_prefetches(p, 1_050, 50, 1_050) for block in run]
    assert issued == list(range(1, 11))  # 11 blocks; block 0 was the demand


def test_steps_must_be_positive():
    with pytest.raises(ValueError):
        policy(step_blocks=0)
