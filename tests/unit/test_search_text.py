"""The search tokenizer (im_server/search_text.py), without a database: the ``tsvector``
literal of a text (tokens and positions) and the ``tsquery`` literal of a query."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from im_server import search_text
from im_server.search_text import (
    MAX_POSITIONS,
    MAX_QUERY_CHARS,
    MAX_WORD_CHARS,
    document,
    message_document,
    query,
    searchable_text,
)


def parse(doc: str | None) -> dict[str, list[int]]:
    """``'tok':1 'other':2 'tok':3`` -> {"tok": [1, 3], "other": [2]}: a token's
    occurrences merged, as PostgreSQL merges them when it reads the literal."""
    assert doc is not None
    out: dict[str, list[int]] = {}
    for m in re.finditer(r"'([^']*)':([\d,]+)", doc):
        out.setdefault(m.group(1), []).extend(int(p) for p in m.group(2).split(","))
    # nothing but tokens
    assert re.sub(r"'[^']*':[\d,]+", "", doc).strip() == "", doc
    return out


# -- document ---------------------------------------------------------------------------------


def test_latin_words_one_token_each_in_order() -> None:
    assert parse(document("Meet me at the Café tomorrow")) == {
        "meet": [1],
        "me": [2],
        "at": [3],
        "the": [4],
        "cafe": [5],
        "tomorrow": [6],
    }


def test_repeated_word_keeps_every_position() -> None:
    assert parse(document("go, go GO!")) == {"go": [1, 2, 3]}


def test_words_keep_digits_and_underscores_and_split_on_punctuation() -> None:
    assert parse(document("snake_case v2.0 e-mail")) == {
        "snake_case": [1],
        "v2": [2],
        "0": [3],
        "e": [4],
        "mail": [5],
    }


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("CAFÉ", "cafe"),
        ("café", "cafe"),
        ("cafe\u0301", "cafe"),  # decomposed accent
        ("Straße", "strasse"),  # case folding, not lower()
        ("ＡＢＣ", "abc"),  # full-width forms
        ("ﬁne", "fine"),  # a compatibility ligature
        ("Ñandú", "nandu"),
        ("ÅNGSTRÖM", "angstrom"),
    ],
)
def test_words_are_folded(text: str, token: str) -> None:
    assert parse(document(text)) == {token: [1]}


def test_cjk_run_gives_a_bigram_per_position_and_the_last_character() -> None:
    assert parse(document("你好世界")) == {"你好": [1], "好世": [2], "世界": [3], "界": [4]}


def test_hangul_and_kana_runs_are_cjk() -> None:
    assert parse(document("한국어")) == {"한국": [1], "국어": [2], "어": [3]}
    assert parse(document("カタカナ")) == {"カタ": [1], "タカ": [2], "カナ": [3], "ナ": [4]}
    # half-width katakana fold to full width
    assert parse(document("ｶﾀｶﾅ")) == parse(document("カタカナ"))


def test_mixed_script_positions_run_on() -> None:
    assert parse(document("iPhone手机 new")) == {"iphone": [1], "手机": [2], "机": [3], "new": [4]}
    # punctuation between two runs separates them: no bigram across it
    toks = parse(document("你好，世界"))
    assert toks == {"你好": [1], "好": [2], "世界": [3], "界": [4]}
    assert "好世" not in toks


def test_single_cjk_character() -> None:
    assert parse(document("好")) == {"好": [1]}


@pytest.mark.parametrize("text", ["", "   ", "?!", "...,;:", "！？。", "\n\t", "-- ~ --"])
def test_nothing_searchable_is_none(text: str) -> None:
    assert document(text) is None
    assert query(text) is None


def test_long_word_is_cut_to_max_word_chars() -> None:
    word = "a" * (MAX_WORD_CHARS + 30)
    assert parse(document(word)) == {"a" * MAX_WORD_CHARS: [1]}
    assert query(word) == "'" + "a" * MAX_WORD_CHARS + "':*"
    accented = "é" * (MAX_WORD_CHARS + 5)
    assert parse(document(accented)) == {"e" * MAX_WORD_CHARS: [1]}


def test_positions_stop_at_max_positions() -> None:
    words = [f"w{i}" for i in range(MAX_POSITIONS + 50)]
    toks = parse(document(" ".join(words)))
    assert len(toks) == MAX_POSITIONS
    assert toks[f"w{MAX_POSITIONS - 1}"] == [MAX_POSITIONS]
    assert f"w{MAX_POSITIONS}" not in toks
    assert max(p for ps in toks.values() for p in ps) == MAX_POSITIONS
    # a CJK run crossing the limit stops there too
    run = "".join(chr(0x4E00 + i) for i in range(MAX_POSITIONS + 20))  # distinct bigrams
    positions = [p for ps in parse(document(run)).values() for p in ps]
    assert sorted(positions) == list(range(1, MAX_POSITIONS + 1))


def test_every_occurrence_is_written_in_order() -> None:
    """PostgreSQL keeps the first 256 positions of a token (checked against it in
    test_search_text_pg.py); the literal names them all."""
    doc = document("ha " * 300)
    assert doc == " ".join(f"'ha':{i}" for i in range(1, 301))


# -- query ------------------------------------------------------------------------------------


def test_query_words_are_prefixes_anded() -> None:
    assert query("Meet CAFÉ") == "'meet':* & 'cafe':*"


def test_query_repeated_words_once() -> None:
    assert query("go go Go") == "'go':*"


def test_query_cjk_run_is_a_phrase_of_bigrams() -> None:
    assert query("你好世界") == "('你好' <-> '好世' <-> '世界')"
    assert query("世界") == "('世界')"
    assert query("好") == "'好':*"


def test_query_mixed() -> None:
    assert query("iPhone手机") == "'iphone':* & ('手机')"
    assert query("你好, world 世") == "('你好') & 'world':* & '世':*"


def test_query_folding_matches_document_folding() -> None:
    for a, b in (("CAFÉ", "cafe"), ("ＡＢＣ", "abc"), ("ｶﾀｶﾅ", "カタカナ"), ("Straße", "STRASSE")):
        assert query(a) == query(b)
        assert document(a) == document(b)


def test_query_of_max_query_chars() -> None:
    q = " ".join(["word"] * (MAX_QUERY_CHARS // 5))
    assert query(q) == "'word':*"
    long_cjk = "你好" * (MAX_QUERY_CHARS // 2)
    tq = query(long_cjk)
    # a run of n characters: n - 1 bigrams in one phrase
    assert tq is not None and tq.count("<->") == MAX_QUERY_CHARS - 2


@pytest.mark.parametrize("text", ["it's", 'say "hi"', "back\\slash", "a'; DROP TABLE x; --"])
def test_quotes_and_backslashes_never_reach_a_token(text: str) -> None:
    for lit in (document(text), query(text)):
        assert lit is not None
        inner = re.findall(r"'([^']*)'", lit)
        assert inner and all("\\" not in t and '"' not in t for t in inner), lit
    assert query("a'; DROP TABLE x; --") == "'a':* & 'drop':* & 'table':* & 'x':*"


# -- message content ----------------------------------------------------------------------------


def test_searchable_text_reads_text_and_name() -> None:
    assert searchable_text({"text": "hello"}) == "hello"
    assert searchable_text({"upload_id": "u", "name": "plan.pdf", "size": 3}) == "plan.pdf"
    assert searchable_text({"text": "a", "name": "b"}) == "a\nb"
    assert searchable_text({"text": 5}) is None
    assert searchable_text({"text": ""}) is None
    assert searchable_text("text") is None
    assert searchable_text(None) is None


def test_message_document() -> None:
    assert message_document(orjson.dumps({"text": "Hi there"}).decode()) == "'hi':1 'there':2"
    assert message_document(orjson.dumps({"name": "report.pdf"}).decode()) == ("'report':1 'pdf':2")
    assert message_document("not json") is None
    assert message_document("null") is None
    assert message_document(orjson.dumps({"text": "?!"}).decode()) is None


def test_notices_get_no_tokens_whatever_their_content() -> None:
    from im_server.storage.messages import NewMessage, search_document

    def m(ctype: str, content: object) -> NewMessage:
        return NewMessage("g:1", 1, 1, "x", ctype, orjson.dumps(content).decode(), 1)

    for ctype in ("system", "recall", "edit", "reaction"):
        assert search_document(m(ctype, {"text": "hello", "name": "a.txt"})) is None, ctype
    assert search_document(m("text", {"text": "hello"})) == "'hello':1"
    assert search_document(m("file", {"upload_id": "u", "name": "a.txt"})) == "'a':1 'txt':2"
    assert search_document(m("custom", {"text": "hi"})) == "'hi':1"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=300))
def test_the_ascii_way_makes_the_same_literal(text: str) -> None:
    """``document``'s short way for ASCII text and the general one agree."""
    assert search_text.document(text) == search_text._document_any(text.lower())


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="Ａａ１_ﬁé café-x ", max_size=60))
def test_text_that_folds_to_ascii_takes_the_short_way_alike(text: str) -> None:
    folded = search_text._fold(text)
    assert search_text.document(text) == search_text._document_any(folded)


def test_the_ascii_way_stops_at_the_last_position() -> None:
    text = "w " * (search_text.MAX_POSITIONS + 10)
    doc = search_text.document(text)
    assert doc is not None
    assert doc.endswith(f"'w':{search_text.MAX_POSITIONS}")
    assert doc == search_text._document_any(text)
