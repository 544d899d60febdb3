"""The pure parts of a search page: which part of a query the GIN index looks up, where a
conversation's time-order reading starts below a cursor, and when a conversation can no
longer add to the page."""

from __future__ import annotations

from im_server.protocol.types import MAX_INT64
from im_server.search_text import parts
from im_server.storage.search import Position, _still_open, first_bound, rarest


def test_the_rarest_part_by_statistics_drives_the_index() -> None:
    shares = {"hello": 0.4, "help": 0.05, "world": 0.02, "你好": 0.3, "好世": 0.001}
    # a prefix counts every common token it begins: "hel" = hello + help
    assert rarest(parts("hel world"), shares).fragment == "'world':*"
    # a run counts its rarest bigram
    assert rarest(parts("world 你好世"), shares).fragment == "('你好' <-> '好世')"
    # one letter is the commonest prefix there is
    assert rarest(parts("h zzyzx"), shares).fragment == "'zzyzx':*"


def test_ties_go_to_the_longest_part_then_to_a_whole_run() -> None:
    # nothing in the statistics (a new database): the longest part
    assert rarest(parts("b zzyzx qq"), {}).fragment == "'zzyzx':*"
    # same length: a run (exact bigrams) before a prefix
    assert rarest(parts("ab 你好"), {}).fragment == "('你好')"


def test_a_conversations_first_bound_keeps_exactly_the_rows_below_the_cursor() -> None:
    cur = Position(1000, "s:1:5", 7)
    # the cursor's own conversation: same time, lower seqs only
    assert first_bound("s:1:5", cur) == (1000, 7)
    # a conversation ordered before it: anything at the same time is below
    assert first_bound("g:9", cur) == (1000, MAX_INT64)
    # one ordered after it: only older times
    assert first_bound("s:2:3", cur) == (1000, 0)

    def below(conv: str, t: int, seq: int) -> bool:
        return (t, conv, seq) < (cur.server_time, cur.conv_id, cur.seq)

    for conv in ("g:9", "s:1:5", "s:2:3"):
        bt, bq = first_bound(conv, cur)
        for t in (999, 1000, 1001):
            for seq in (1, 6, 7, 8, 10**12):
                assert ((t, seq) < (bt, bq)) == below(conv, t, seq), (conv, t, seq)


def test_conversations_close_once_their_unread_rows_cannot_make_the_page() -> None:
    found = [Position(t, "g:1", t) for t in (100, 90, 80)]
    bounds = {"g:1": (50, 50), "g:2": (85, 3), "g:3": (79, 5)}
    # a short page: every conversation stays open
    page, still = _still_open(bounds, found, 4)
    assert [p.server_time for p in page] == [100, 90, 80] and still == bounds
    # a full page whose last result is (80, g:1, 80): g:2's unread rows lie below (85, 3),
    # which is above it, so g:2 may still add; g:1 and g:3 may not
    page, still = _still_open(bounds, found, 3)
    assert len(page) == 3 and still == {"g:2": (85, 3)}
