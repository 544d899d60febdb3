"""Table-driven tests of the pure history planner ``plan(win, begin, end, limit, descending)``.

``plan`` answers ``(b, e, is_end)``: the seq range to fetch (``b > e`` means nothing) and
the ``is_end`` flag of the contract (asc: nothing after the range, desc: nothing before)."""

from __future__ import annotations

import pytest

from im_server.services.history import Window, plan

W1000 = Window(1, 1000)
W10_20 = Window(10, 20)
W100_200 = Window(100, 200)
EMPTY = Window(31, 30)  # hi = lo - 1: nothing visible (a cleared conversation)

# (id, window, begin, end, limit, expected range or None for "nothing", is_end asc, is_end desc)
CASES = [
    # inside the window, not truncated
    ("inner", W10_20, 12, 15, 50, (12, 15), False, False),
    ("exact-window", W10_20, 10, 20, 50, (10, 20), True, True),
    ("starts-at-lo", W10_20, 10, 15, 50, (10, 15), False, True),
    ("ends-at-hi", W10_20, 15, 20, 50, (15, 20), True, False),
    ("single-seq", W10_20, 14, 14, 50, (14, 14), False, False),
    # clamping at both ends
    ("clamp-low", W10_20, 0, 15, 50, (10, 15), False, True),
    ("clamp-high", W10_20, 15, 10_000, 50, (15, 20), True, False),
    ("clamp-both", W10_20, 1, 100, 50, (10, 20), True, True),
    # truncation keeps the `limit` seqs nearest `end`
    ("seed-truncation", W1000, 1, 100_000, 50, (951, 1000), True, False),
    ("truncate-middle", W1000, 1, 500, 10, (491, 500), False, False),
    ("limit-reaches-lo", W1000, 1, 50, 50, (1, 50), False, True),
    ("limit-one-short-of-lo", W1000, 1, 51, 50, (2, 51), False, False),
    ("limit-one", W1000, 1, 1000, 1, (1000, 1000), True, False),
    ("clamped-then-truncated", W10_20, 0, 10_000, 5, (16, 20), True, False),
    # the seed's question: range wholly below the window
    ("seed-below-window", W100_200, 1, 50, 50, None, False, True),
    ("below-window-touching", W100_200, 1, 99, 50, None, False, True),
    ("overlaps-lo-by-one", W100_200, 1, 100, 50, (100, 100), False, True),
    # wholly above the window
    ("above-window", W10_20, 21, 30, 50, None, True, False),
    ("far-above-window", W10_20, 1_000, 2_000, 50, None, True, False),
    ("overlaps-hi-by-one", W10_20, 20, 30, 50, (20, 20), True, False),
    # begin / end omitted: the whole window, truncated to the seqs nearest end
    ("none-none-small", W10_20, None, None, 50, (10, 20), True, True),
    ("none-none-truncated", W1000, None, None, 50, (951, 1000), True, False),
    ("none-begin", W1000, None, 100, 50, (51, 100), False, False),
    ("none-begin-reaches-lo", W1000, None, 40, 50, (1, 40), False, True),
    ("none-end", W1000, 990, None, 50, (990, 1000), True, False),
    ("none-end-truncated", W1000, 1, None, 50, (951, 1000), True, False),
    ("none-end-above-window", W10_20, 30, None, 50, None, True, False),
    # empty window (hi = lo - 1)
    ("empty-none-none", EMPTY, None, None, 50, None, True, True),
    ("empty-explicit", EMPTY, 1, 100, 50, None, True, True),
    ("empty-before", EMPTY, 1, 10, 50, None, False, True),  # asc: end 10 < max_seq 30
    ("empty-after", EMPTY, 40, 50, 50, None, True, False),
    ("empty-fresh-conv", Window(1, 0), None, None, 50, None, True, True),
]


def _range(b: int, e: int) -> tuple[int, int] | None:
    return (b, e) if b <= e else None


@pytest.mark.parametrize(
    ("win", "begin", "end", "limit", "expected", "end_asc", "end_desc"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_plan(
    win: Window,
    begin: int | None,
    end: int | None,
    limit: int,
    expected: tuple[int, int] | None,
    end_asc: bool,
    end_desc: bool,
) -> None:
    b, e, is_end = plan(win, begin, end, limit, False)
    assert _range(b, e) == expected
    assert is_end is end_asc

    b, e, is_end = plan(win, begin, end, limit, True)
    assert _range(b, e) == expected, "the order must not change which seqs are kept"
    assert is_end is end_desc


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("limit", [1, 7, 50, 500])
def test_plan_never_exceeds_limit_nor_leaves_window(descending: bool, limit: int) -> None:
    for win in (W1000, W10_20, W100_200, EMPTY):
        for begin in (None, 0, 1, 15, 150, 999, 5000):
            for end in (None, 0, 10, 20, 150, 1000, 10**12):
                if begin is not None and end is not None and begin > end:
                    continue
                b, e, _ = plan(win, begin, end, limit, descending)
                if b > e:
                    continue
                assert e - b + 1 <= limit
                assert win.lo <= b and e <= win.hi
                # the kept seqs are the ones nearest the (clamped) end
                assert e == min(win.hi, win.hi if end is None else end)


def test_paging_back_desc_collects_every_seq_once() -> None:
    """The client recipe: page back with end = previous begin - 1 until is_end."""
    win = Window(3, 437)
    seen: list[int] = []
    end: int | None = None
    for _ in range(100):
        b, e, is_end = plan(win, None, end, 50, True)
        seen.extend(range(e, b - 1, -1))
        if is_end:
            break
        end = b - 1
    else:
        pytest.fail("paging back never reached is_end")
    assert seen == list(range(437, 2, -1))
