"""The recall rule the persister applies to each batch (``services.recall.blanking``): a
recall notice ``{"seq": n}`` blanks message ``n`` of its conversation; an original in the
same batch is stored blank, an earlier one is blanked by an update."""

from __future__ import annotations

import orjson
import pytest

from im_server.services.recall import Blanking, blanking, recall_target
from im_server.storage.messages import NewMessage


def msg(conv: str, seq: int, ctype: str = "text", content: str = '{"text":"x"}') -> NewMessage:
    return NewMessage(conv, seq, 1, f"m{conv}{seq}", ctype, content, 0)


def notice(conv: str, seq: int, target: object) -> NewMessage:
    return msg(conv, seq, "recall", orjson.dumps({"seq": target}).decode())


def test_no_notice_blanks_nothing() -> None:
    assert blanking([msg("s:1:2", 1), msg("g:3", 1, "system", '{"event":"joined"}')]) == (
        Blanking(set(), [])
    )
    assert blanking([]) == Blanking(set(), [])


def test_original_in_the_batch_and_earlier_ones() -> None:
    batch = [
        msg("s:1:2", 5),
        notice("s:1:2", 6, 5),  # same batch
        notice("s:1:2", 7, 2),  # stored before
        notice("g:3", 9, 4),
        msg("g:3", 4),  # a seq of another conversation is not the target
    ]
    got = blanking(batch)
    assert got.in_batch == {("s:1:2", 5), ("g:3", 4)}
    assert got.earlier == [("s:1:2", 2)]


def test_targets_are_per_conversation_and_sorted() -> None:
    batch = [notice("s:1:2", 9, 3), notice("g:3", 9, 8), notice("g:3", 10, 1), msg("g:3", 3)]
    assert blanking(batch) == Blanking(set(), [("g:3", 1), ("g:3", 8), ("s:1:2", 3)])


@pytest.mark.parametrize(
    "content",
    ['{"seq":"5"}', '{"seq":true}', '{"seq":null}', "{}", "[5]", "5", "not json", '{"seq":5.0}'],
)
def test_a_notice_without_an_integer_seq_names_nothing(content: str) -> None:
    """Notices are made by the server; a bad one must not stop the batch."""
    m = msg("s:1:2", 6, "recall", content)
    assert recall_target(m) is None
    assert blanking([msg("s:1:2", 5), m]) == Blanking(set(), [])


def test_only_recall_notices_name_a_target() -> None:
    assert recall_target(msg("s:1:2", 1, "text", '{"seq":1}')) is None
    assert recall_target(notice("s:1:2", 2, 1)) == ("s:1:2", 1)
