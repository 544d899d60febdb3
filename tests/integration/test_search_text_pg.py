"""The search tokens against real PostgreSQL: ``document(text)`` cast to ``tsvector``
matches ``query(q)`` cast to ``tsquery`` exactly when the protocol's rule says so.

The rule, for a text and a query made of CJK runs, Latin words and punctuation: every
piece of the query matches; a Latin word matches when some word of the text begins with
it (case and accents folded); a CJK run matches when it occurs in the text as a
substring. The reference below implements that rule naively on a small alphabet (so
that random texts and queries collide often), independently of im_server.search_text.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import asyncpg
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from im_server.search_text import document, query
from tests.support import Stores, pg

HYPO = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

CJK = "你好世界天气한국어カタひら"
LATIN = "abcABCéÉ"
PUNCT = [" ", " ", ",", "!", "，", "。", "?", "-", "\n"]
_FOLD = str.maketrans({"A": "a", "B": "b", "C": "c", "é": "e", "É": "e"})
_PIECE = re.compile(f"([{CJK}]+)|([{LATIN}e]+)")  # e: what é folds to


def reference_match(text: str, q: str) -> bool:
    t = text.translate(_FOLD)
    words = [m.group(2) for m in _PIECE.finditer(t) if m.group(2)]
    pieces = list(_PIECE.finditer(q.translate(_FOLD)))
    assert pieces, q
    for m in pieces:
        run, word = m.group(1), m.group(2)
        if word is not None:
            if not any(w.startswith(word) for w in words):
                return False
        elif run not in t:
            return False
    return True


cjk_runs = st.text(alphabet=CJK, min_size=1, max_size=6)
latin_words = st.text(alphabet=LATIN, min_size=1, max_size=5)
pieces = st.one_of(cjk_runs, latin_words, st.sampled_from(PUNCT))
texts = st.lists(pieces, min_size=0, max_size=14).map("".join)


@st.composite
def text_and_query(draw: st.DrawFn) -> tuple[str, str]:
    text = draw(texts)
    kind = draw(st.sampled_from(["substring", "substring", "pieces", "random"]))
    if kind == "substring" and text:
        i = draw(st.integers(0, len(text) - 1))
        j = draw(st.integers(i + 1, len(text)))
        q = text[i:j]
    elif kind == "pieces":
        q = draw(st.lists(st.one_of(cjk_runs, latin_words), min_size=1, max_size=3).map(" ".join))
    else:
        q = draw(texts)
    return text, q


@pytest.fixture(scope="module")
async def db(stores: Stores) -> AsyncIterator[asyncpg.Connection]:
    async with pg(stores) as conn:
        yield conn


async def pg_match(db: asyncpg.Connection, doc: str | None, tsq: str) -> bool:
    if doc is None:
        # nothing indexed: PostgreSQL would store NULL, which matches nothing
        return False
    return bool(
        await db.fetchval(
            "SELECT CAST($1::text AS tsvector) @@ CAST($2::text AS tsquery)", doc, tsq
        )
    )


@settings(HYPO, max_examples=600)
@given(tq=text_and_query())
@example(tq=("你好世界，今天天气很好", "界天"))
@example(tq=("你好世界", "好世界"))
@example(tq=("世界", "世"))
@example(tq=("abc, cab", "ca"))
@example(tq=("abcé", "ABCE"))
@example(tq=("ひら한국", "ら한"))
@example(tq=("ひら a 한국", "ら한"))
@example(tq=("天天天", "天天天"))
@example(tq=("天天", "天天天"))
@example(tq=("카타", "カタ"))
async def test_match_is_the_substring_rule(db: asyncpg.Connection, tq: tuple[str, str]) -> None:
    text, q = tq
    tsq = query(q)
    has_piece = _PIECE.search(q) is not None
    assert (tsq is not None) == has_piece, (q, tsq)
    assume(tsq is not None)
    assert tsq is not None
    got = await pg_match(db, document(text), tsq)
    assert got == reference_match(text, q), (text, q, document(text), tsq)


# any Unicode: the literals always parse, and a text finds itself and its own words
any_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)


@settings(HYPO, max_examples=400)
@given(text=any_text)
@example(text="ǅemal ﬀ Ⅻ ²³ ㎏ ﹏ ｶﾞ ᄀ ힰ 𠀀𠀁")
@example(text="x\u0301 \u0301 é\u0308 Å İstanbul ΣΑΣ ß ẞ")
@example(text="'quoted' \\back\\ \"double\" :* & | ! <-> ()")
async def test_any_text_finds_itself(db: asyncpg.Connection, text: str) -> None:
    doc, tsq = document(text), query(text)
    assert (doc is None) == (tsq is None), (text, doc, tsq)
    if doc is None or tsq is None:
        return
    assert await pg_match(db, doc, tsq), (text, doc, tsq)
    # every piece on its own finds it too
    for m in re.finditer(r"\S+", text):
        part = query(m.group(0))
        if part is not None:
            assert await pg_match(db, doc, part), (text, m.group(0), doc, part)


async def test_postgresql_merges_repeated_tokens_and_keeps_256_positions(
    db: asyncpg.Connection,
) -> None:
    """document() writes each occurrence; PostgreSQL merges a token's positions and keeps
    its first 256 (what a phrase can still use)."""
    doc = document("ha " * 300 + "你好 你好")
    row = await db.fetchrow(
        "SELECT array_length(v.positions, 1), v.positions[1], v.positions[256] "
        "FROM unnest(CAST($1::text AS tsvector)) AS v WHERE v.lexeme = 'ha'",
        doc,
    )
    assert tuple(row) == (256, 1, 256)
    lexemes = await db.fetch(
        "SELECT v.lexeme, v.positions FROM unnest(CAST($1::text AS tsvector)) AS v "
        "WHERE v.lexeme <> 'ha' ORDER BY 1",
        doc,
    )
    assert sorted((r[0], list(r[1])) for r in lexemes) == sorted(
        [("你好", [301, 303]), ("好", [302, 304])]
    )
