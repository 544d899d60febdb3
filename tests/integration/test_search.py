"""Search (PROTOCOL.md "Search"): the messages I can see that contain the query, newest
first, in pages."""

from __future__ import annotations

from im_server.client import Client
from tests.support import befriend, new_user, persisted
from tests.support import send_ok as _send


async def _pair(url: str) -> tuple[Client, Client, str]:
    a, b = await new_user(url, "sa"), await new_user(url, "sb")
    conv = await befriend(a, b)
    return a, b, conv


async def test_words_prefixes_and_cjk_substrings_match(url: str) -> None:
    a, b, conv = await _pair(url)
    try:
        s1 = await _send(a, conv, "Meet me at the Café tomorrow")
        s2 = await _send(b, conv, "你好世界，今天天气很好")
        s3 = await _send(a, conv, "東京タワーに行きました")
        await persisted(a, conv, s3)

        async def seqs(c: Client, q: str) -> list[int]:
            return [m["seq"] for m in (await c.search(q))["results"]]

        assert await seqs(a, "cafe") == [s1]
        assert await seqs(b, "tomor") == [s1]
        assert await seqs(a, "MEET café") == [s1]
        assert await seqs(a, "世界") == [s2]
        assert await seqs(a, "好世界") == [s2]
        assert await seqs(a, "天气很") == [s2]
        assert await seqs(a, "界天") == []  # not a substring: "，" stands between
        assert await seqs(a, "好") == [s2]
        assert await seqs(a, "タワー") == [s3]
        assert await seqs(a, "meat") == []
    finally:
        await a.aclose()
        await b.aclose()
