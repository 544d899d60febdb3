"""Search (PROTOCOL.md "Search"): the messages I can see that contain the query, newest
first, in pages.

Every window check compares with history: what a user finds is exactly the messages
history shows that user (same content, same seqs) that contain the query."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest

from im_server.client import ApiError, Client, group_conv_id, single_conv_id
from im_server.client.transport import HttpPool
from tests.support import Make, Stores, befriend, eventually, new_user, persisted, pg
from tests.support import send_ok as _send

NOTICES = ["system", "recall", "edit", "reaction"]


async def _pair(url: str) -> tuple[Client, Client, str]:
    a, b = await new_user(url, "sa"), await new_user(url, "sb")
    conv = await befriend(a, b)
    return a, b, conv


def _tag() -> str:
    """A word no other test sends (letters only: a whole word, never a prefix of another)."""
    return "zq" + "".join(chr(ord("a") + int(c, 16)) for c in uuid.uuid4().hex[:12])


async def _found(c: Client, q: str, conv: str | None = None) -> list[tuple[str, int]]:
    return [(m["conv_id"], m["seq"]) for m in await c.search_all(q, conv)]


async def _seqs(c: Client, q: str, conv: str | None = None) -> list[int]:
    return [m["seq"] for m in await c.search_all(q, conv)]


async def _history(c: Client, conv: str) -> dict[int, dict[str, Any]]:
    page = await c.history(conv, begin=1, end=10**9, limit=500)
    assert page["is_end"], page
    return {m["seq"]: m for m in page["messages"]}


def _words(m: dict[str, Any]) -> str:
    c = m.get("content") or {}
    return " ".join(str(c.get(k, "")) for k in ("text", "name"))


async def _expect_as_history(c: Client, tag: str, convs: list[str]) -> list[int]:
    """Search ``tag`` as ``c``: the results are exactly the messages ``c``'s history shows
    (the same message objects) whose text holds ``tag``, newest first; answers their
    seqs (of the first conversation, for the callers that use one)."""
    results = await c.search_all(tag)
    want: list[dict[str, Any]] = []
    for conv in convs:
        hist = await _history(c, conv)
        want += [
            m
            for m in hist.values()
            if m["content_type"] not in NOTICES and not m.get("recalled") and tag in _words(m)
        ]
        for m in results:
            if m["conv_id"] == conv:
                assert m["seq"] in hist, f"found {m['seq']} outside {c}'s history of {conv}"
                assert m == hist[m["seq"]], (m, hist[m["seq"]])
    want.sort(key=lambda m: (m["server_time"], m["conv_id"], m["seq"]), reverse=True)
    assert [(m["conv_id"], m["seq"]) for m in results] == [
        (m["conv_id"], m["seq"]) for m in want
    ], c
    # the conv_id filter gives the same per conversation
    for conv in convs:
        one = await c.search_all(tag, conv)
        assert one == [m for m in results if m["conv_id"] == conv]
    return [m["seq"] for m in results if m["conv_id"] == convs[0]]


async def _error(call: Any) -> tuple[int, str]:
    with pytest.raises(ApiError) as e:
        await call
    return e.value.status, e.value.code


# -- matching -----------------------------------------------------------------------------------


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


async def test_latin_rules(make: Make) -> None:
    a, b = await make("la"), await make("lb")
    conv = await befriend(a, b)
    s1 = await _send(a, conv, "See you TOMORROW at the café, Zoë!")
    s2 = await _send(b, conv, "Crème brûlée for dessert")
    s3 = await _send(a, conv, "the cafeteria is closed")
    s4 = await _send(b, conv, "Straße and ＦＵＬＬ width")
    await persisted(a, conv, s4)
    cases: list[tuple[str, list[int]]] = [
        ("tomorrow", [s1]),
        ("Tomorrow", [s1]),
        ("tOmOr", [s1]),  # a prefix, any case
        ("cafe", [s3, s1]),  # café and the prefix of cafeteria
        ("CAFÉ", [s3, s1]),
        ("cafés", []),  # longer than any word
        ("zoe", [s1]),
        ("ZOË", [s1]),
        ("creme brulee", [s2]),
        ("brûlée crème", [s2]),  # any order
        ("dessert creme", [s2]),
        ("dessert cafe", []),  # every word must match, in one message
        ("orrow", []),  # inside a word, not its start: no match
        ("morrow", []),
        ("eteria", []),
        ("at you see", [s1]),
        ("strasse", [s4]),
        ("STRASS", [s4]),
        ("full", [s4]),
        ("ｗｉｄｔｈ", [s4]),
        ("the", [s3, s1]),
        ("t", [s3, s1]),  # one letter: a prefix too
        ("x y", []),
    ]
    for q, want in cases:
        assert await _seqs(a, q) == want, q
        assert await _seqs(b, q, conv) == want, q


async def test_cjk_rules(make: Make) -> None:
    a, b = await make("ca"), await make("cb")
    conv = await befriend(a, b)
    s1 = await _send(a, conv, "오늘 날씨가 정말 좋네요")
    s2 = await _send(b, conv, "ひらがなとカタカナのテスト")
    s3 = await _send(a, conv, "我买了新的iPhone手机")
    s4 = await _send(b, conv, "手机号码是多少？")
    await persisted(a, conv, s4)
    cases: list[tuple[str, list[int]]] = [
        ("날씨", [s1]),
        ("날씨가", [s1]),
        ("씨가", [s1]),  # a substring inside a Hangul run
        ("정말 좋네", [s1]),
        ("좋네요오늘", []),  # not adjacent in the text
        ("날씨 정말", [s1]),
        ("がなと", [s2]),
        ("カタカナ", [s2]),
        ("タカ", [s2]),
        ("ｶﾀｶﾅ", [s2]),  # half-width kana fold
        ("カナのテ", [s2]),
        ("カナテ", []),
        ("iPhone手机", [s3]),
        ("手机", [s4, s3]),
        ("IPHONE", [s3]),
        ("iph 手机", [s3]),
        ("新的iPhone", [s3]),
        ("手机号", [s4]),
        ("机", [s4, s3]),  # one character: wherever it occurs
        ("的新", []),
        ("买了新的", [s3]),
    ]
    for q, want in cases:
        assert await _seqs(a, q) == want, q


async def test_punctuation_only_query_finds_nothing(make: Make) -> None:
    a, b = await make("pa"), await make("pb")
    conv = await befriend(a, b)
    s = await _send(a, conv, "?! what?!")
    await persisted(a, conv, s)
    for q in ("?!", "...", "？！", "-", "~~ ~~"):
        assert await a.search(q) == {"results": [], "next_before": None}, q
    assert await _seqs(a, "what?!") == [s]


async def test_a_file_is_found_by_its_name(make: Make) -> None:
    a, b = await make("fa"), await make("fb")
    conv = await befriend(a, b)
    upload_id = await a.upload(b"quarterly numbers", "text/plain", "Quarterly-Résumé_2026.txt")
    ack = await a.send_rest(conv, {"upload_id": upload_id}, "file")
    assert ack["ok"] is True, ack
    seq = int(ack["seq"])
    await persisted(a, conv, seq)
    [m] = (await b.history(conv, seq, seq))["messages"]
    assert m["content"]["name"] == "Quarterly-Résumé_2026.txt"
    for q in ("quarterly", "QUART", "resume", "Résumé_2026", "txt", "quarterly resume"):
        assert await _seqs(b, q) == [seq], q
    assert await _seqs(b, "numbers") == []  # the bytes are not indexed
    assert (await b.search("quarterly"))["results"][0] == m
    # a caption edit keeps the name, and the name keeps finding it
    await a.edit(conv, seq, {"upload_id": upload_id, "caption": "see the totals"})
    [m] = (await b.history(conv, seq, seq))["messages"]
    assert m["content"]["name"] == "Quarterly-Résumé_2026.txt" and m["content"]["caption"]
    await eventually(lambda: _first_is(b, "quarterly", m))
    assert await _seqs(b, "resume") == [seq]


# -- windows -------------------------------------------------------------------------------------


async def test_cleared_history_is_not_searched(make: Make) -> None:
    a, b = await make("ka"), await make("kb")
    conv = await befriend(a, b)
    tag = _tag()
    s1 = await _send(a, conv, f"before the clear {tag}")
    s2 = await _send(b, conv, f"{tag} also before")
    await persisted(a, conv, s2)
    assert await _expect_as_history(a, tag, [conv]) == [s2, s1]
    await a.clear(conv)
    assert await _expect_as_history(a, tag, [conv]) == []
    s3 = await _send(b, conv, f"after the clear {tag}")
    await persisted(b, conv, s3)
    assert await _expect_as_history(a, tag, [conv]) == [s3]
    assert await _expect_as_history(b, tag, [conv]) == [s3, s2, s1]  # b did not clear
    await b.clear(conv)
    assert await _expect_as_history(b, tag, [conv]) == []
    assert await _expect_as_history(a, tag, [conv]) == [s3]
    # hiding a conversation is not clearing it: history and search keep it
    await a.hide(conv)
    assert await _expect_as_history(a, tag, [conv]) == [s3]


async def test_group_windows_as_history(make: Make) -> None:
    """The owner O, a stayer S, K kicked, L who left, J added without history, H added
    with history, R who left and was added again: each finds what its history shows."""
    O, S, K, L, J, H, R = [  # noqa: E741
        await make(p) for p in ("own", "stay", "kick", "left", "join", "hist", "rejoin")
    ]
    tag = _tag()
    g = await O.create_group("search windows", [x.user_id for x in (S, K, L, R)])  # type: ignore[misc]
    gid, conv = int(g["group_id"]), str(g["conv_id"])
    sent: dict[str, int] = {}

    async def say(c: Client, name: str) -> None:
        sent[name] = await _send(c, conv, f"{name} {tag}")

    await say(O, "m1")
    await say(K, "m2")
    await say(L, "m3")
    await R.leave(gid)
    await say(S, "m4")
    await O.kick(gid, K.user_id)  # type: ignore[arg-type]
    await say(O, "m5")
    await L.leave(gid)
    await say(S, "m6")
    await O.add_members(gid, [J.user_id], with_history=False)  # type: ignore[list-item]
    await say(O, "m7")
    await O.add_members(gid, [H.user_id], with_history=True)  # type: ignore[list-item]
    await O.add_members(gid, [R.user_id], with_history=True)  # type: ignore[list-item]
    await say(J, "m8")
    await say(H, "m9")
    await persisted(O, conv, sent["m9"])

    every = [sent[f"m{i}"] for i in range(9, 0, -1)]
    want = {
        O: every,
        S: every,
        H: every,
        K: [sent["m4"], sent["m3"], sent["m2"], sent["m1"]],  # up to the kick, still found
        L: [sent["m5"], sent["m4"], sent["m3"], sent["m2"], sent["m1"]],
        J: [sent["m9"], sent["m8"], sent["m7"]],
        R: [sent["m9"], sent["m8"]],  # a re-join starts a new window
    }
    for who, seqs in want.items():
        assert await _expect_as_history(who, tag, [conv]) == seqs, who
    # messages after a kick or a leave are not found, even by their exact words
    assert await _seqs(K, f"m5 {tag}") == []
    assert await _seqs(K, f"m3 {tag}") == [sent["m3"]]
    assert await _seqs(J, f"m1 {tag}") == []
    # a later message does not reach the closed windows
    await say(S, "m10")
    await persisted(O, conv, sent["m10"])
    assert (await _seqs(O, tag))[0] == sent["m10"]
    for who in (K, L):
        assert await _seqs(who, tag) == want[who]


async def test_recalled_messages_are_never_found(make: Make) -> None:
    own, member = await make("ro"), await make("rm")
    peer = await make("rp")
    conv = await befriend(own, peer)
    g = await own.create_group("recalls", [member.user_id])  # type: ignore[list-item]
    group = str(g["conv_id"])
    tag = _tag()
    # recalled by the sender after it was stored
    s1 = await _send(own, conv, f"one {tag}")
    keep = await _send(peer, conv, f"kept {tag}")
    await persisted(own, conv, keep)
    assert await _seqs(own, f"one {tag}") == [s1]
    await own.recall(conv, s1)
    await eventually(lambda: _seqs_is(own, f"one {tag}", []))
    assert await _seqs(peer, tag) == [keep]
    # recalled at once (perhaps before the persister stored it)
    s2 = await _send(peer, conv, f"two {tag}")
    await peer.recall(conv, s2)
    s3 = await _send(peer, conv, f"three {tag}")
    await persisted(peer, conv, s3)
    await eventually(lambda: _seqs_is(own, f"three {tag}", [s3]))
    assert await _seqs(own, f"two {tag}") == []
    # a member's message recalled by the owner of the group
    g1 = await _send(member, group, f"four {tag}")
    await persisted(own, group, g1)
    assert await _seqs(member, f"four {tag}") == [g1]
    await own.recall(group, g1)
    await eventually(lambda: _seqs_is(member, f"four {tag}", []))
    for who, convs in ((own, [conv, group]), (peer, [conv]), (member, [group])):
        await _expect_as_history(who, tag, convs)
    assert await _seqs(own, tag) == [s3, keep]


async def _first_is(c: Client, q: str, m: dict[str, Any]) -> bool:
    return (await c.search_all(q))[:1] == [m]


async def _seqs_is(c: Client, q: str, want: list[int]) -> bool:
    return await _seqs(c, q) == want


async def test_edited_messages_are_found_by_their_new_words(make: Make) -> None:
    a, b = await make("ea"), await make("eb")
    conv = await befriend(a, b)
    tag = _tag()
    s1 = await _send(a, conv, f"alpha {tag}")
    await persisted(a, conv, s1)
    assert await _seqs(b, "alpha") == [s1]
    await a.edit(conv, s1, f"omega {tag}")
    await eventually(lambda: _seqs_is(b, "omega", [s1]))
    assert await _seqs(b, "alpha") == []
    [m] = await b.search_all("omega")
    assert m["content"] == {"text": f"omega {tag}"}
    # an edit right after the send (perhaps before the persister stored the message)
    s2 = await _send(b, conv, f"北京欢迎你 {tag}")
    await b.edit(conv, s2, f"上海欢迎你 {tag}")
    await eventually(lambda: _seqs_is(a, "上海", [s2]))
    assert await _seqs(a, "北京") == []
    assert await _seqs(a, "欢迎你") == [s2]
    # edited twice: only the last words
    await a.edit(conv, s1, f"gamma {tag}")
    await eventually(lambda: _seqs_is(a, "gamma", [s1]))
    assert await _seqs(a, "omega") == [] and await _seqs(a, "alpha") == []
    # the edit notices (which carry the new content) are never found
    assert await _expect_as_history(a, tag, [conv]) == [s2, s1]
    assert await _expect_as_history(b, tag, [conv]) == [s2, s1]
    # edited to nothing searchable: found by nothing
    await a.edit(conv, s1, "?!")
    await eventually(lambda: _seqs_is(a, "gamma", []))
    assert await _expect_as_history(b, tag, [conv]) == [s2]


async def test_notices_carry_no_search_tokens(make: Make, stores: Stores) -> None:
    """Group notices (members added, left, kicked, muted, unmuted), recall, edit and
    reaction notices: none is found, and none has tokens in PostgreSQL."""
    own, m1, m2 = await make("no"), await make("n1"), await make("n2")
    g = await own.create_group("notices", [m1.user_id, m2.user_id])  # type: ignore[list-item]
    gid, conv = int(g["group_id"]), str(g["conv_id"])
    tag = _tag()
    s1 = await _send(own, conv, f"first {tag}")
    s2 = await _send(m1, conv, f"second {tag}")
    await own.edit(conv, s1, f"edited {tag}")
    await m1.recall(conv, s2)
    await m2.react(conv, s1, "👍")
    await own.mute_member(gid, m2.user_id, 4102444800000)  # type: ignore[arg-type]
    await own.mute_member(gid, m2.user_id, 0)  # type: ignore[arg-type]
    await own.kick(gid, m2.user_id)  # type: ignore[arg-type]
    await m1.leave(gid)
    last = await _send(own, conv, f"last {tag}")
    await persisted(own, conv, last)
    full = await _history(own, conv)
    kinds = {m["content_type"] for m in full.values()}
    assert {"system", "recall", "edit", "reaction"} <= kinds, kinds
    assert await _expect_as_history(own, tag, [conv]) == [last, s1]
    for q in ("edited", "first", "members", "muted", "kicked", "system", "seq", "emoji", "👍"):
        found = await _seqs(own, q, conv)
        assert all(full[s]["content_type"] == "text" for s in found), (q, found)
    async with pg(stores) as db:
        rows = await db.fetch(
            "SELECT seq, content_type, search IS NOT NULL AS has FROM messages WHERE conv_id = $1",
            conv,
        )
    tokens = {r["seq"]: (r["content_type"], r["has"]) for r in rows}
    assert tokens[s1] == ("text", True) and tokens[last] == ("text", True)
    assert tokens[s2] == ("text", False)  # recalled
    assert [s for s, (t, has) in tokens.items() if t in NOTICES and has] == []


async def test_other_users_conversations_are_never_found(make: Make) -> None:
    a, b, c, d = await make("oa"), await make("ob"), await make("oc"), await make("od")
    ab = await befriend(a, b)
    cd = await befriend(c, d)
    g = await c.create_group("theirs", [d.user_id])  # type: ignore[list-item]
    tag = _tag()
    s1 = await _send(a, ab, f"ours {tag}")
    t1 = await _send(c, cd, f"theirs {tag}")
    t2 = await _send(d, str(g["conv_id"]), f"their group {tag}")
    await persisted(a, ab, s1)
    await persisted(c, cd, t1)
    await persisted(c, str(g["conv_id"]), t2)
    assert await _found(a, tag) == [(ab, s1)]
    assert await _found(b, tag) == [(ab, s1)]
    assert sorted(await _found(c, tag)) == sorted([(cd, t1), (str(g["conv_id"]), t2)])
    assert await _found(d, "ours") == []
    # a stranger with the same word sees nothing of ours
    e = await make("oe")
    assert await _found(e, tag) == []


# -- conv_id -------------------------------------------------------------------------------------


async def test_conv_id_filter_and_refusals_as_history(make: Make) -> None:
    a, b, c, z = await make("fa"), await make("fb"), await make("fc"), await make("fz")
    ab, ac = await befriend(a, b), await befriend(a, c)
    g = await b.create_group("bc only", [c.user_id])  # type: ignore[list-item]
    bc_group = str(g["conv_id"])
    tag = _tag()
    s_ab = await _send(a, ab, f"to b {tag}")
    s_ac = await _send(a, ac, f"to c {tag}")
    s_g = await _send(b, bc_group, f"in the group {tag}")
    await persisted(a, ab, s_ab)
    await persisted(a, ac, s_ac)
    await persisted(b, bc_group, s_g)
    assert await _found(a, tag, ab) == [(ab, s_ab)]
    assert await _found(a, tag, ac) == [(ac, s_ac)]
    assert sorted(await _found(a, tag)) == sorted([(ab, s_ab), (ac, s_ac)])
    assert await _found(c, tag, bc_group) == [(bc_group, s_g)]
    # not mine: the answer history gives
    for who, conv in (
        (a, bc_group),  # a group I am not in
        (z, ab),  # someone else's single chat
        (c, ab),
        (z, single_conv_id(z.user_id or 0, a.user_id or 0)),  # never friends
        (a, group_conv_id(2**62 + 77)),  # no such group
    ):
        expected = await _error(who.history(conv))
        assert expected[0] in (403, 404), expected
        assert await _error(who.search(tag, conv)) == expected, (who, conv)
        # even when nothing could match
        assert await _error(who.search("?!", conv)) == expected, (who, conv)
    # malformed conv_id: 400, as history
    for bad in ("nonsense", "g:0", "g:01", "s:2:1", "s:1:1", "x:1", f"g:{2**63}", "", ab + "\n"):
        assert await _error(a.search(tag, bad)) == (400, "bad_request"), bad


# -- paging -----------------------------------------------------------------------------------------


async def test_paging_newest_first_every_result_once(make: Make) -> None:
    a, b, c = await make("ga"), await make("gb"), await make("gc")
    ab, ac = await befriend(a, b), await befriend(a, c)
    tag = _tag()
    sent: list[tuple[str, int]] = []
    for i in range(45):
        conv, who = (ab, b) if i % 3 else (ac, c)
        sent.append((conv, await _send(who if i % 2 else a, conv, f"{i} {tag}")))
        if i % 7 == 0:
            await _send(a, conv, "not a match")
    for conv in (ab, ac):
        await persisted(a, conv, max(s for cv, s in sent if cv == conv))
    hist = {**{(ab, s): m for s, m in (await _history(a, ab)).items()}}
    hist.update({(ac, s): m for s, m in (await _history(a, ac)).items()})
    order = sorted(
        sent,
        key=lambda k: (hist[k]["server_time"], hist[k]["conv_id"], hist[k]["seq"]),
        reverse=True,
    )
    pages: list[list[tuple[str, int]]] = []
    before: str | None = None
    while True:
        page = await a.search(tag, limit=10, before=before)
        pages.append([(m["conv_id"], m["seq"]) for m in page["results"]])
        for m in page["results"]:
            assert m == hist[(m["conv_id"], m["seq"])]
        before = page["next_before"]
        if before is None:
            break
        assert isinstance(before, str) and len(pages) < 10
    assert [len(p) for p in pages] == [10, 10, 10, 10, 5]
    flat = [k for p in pages for k in p]
    assert flat == order
    assert len(set(flat)) == 45
    # exactly a multiple of the limit: the last full page says where the end is
    pages9: list[int] = []
    before = None
    while True:
        page = await a.search(tag, limit=9, before=before)
        pages9.append(len(page["results"]))
        before = page["next_before"]
        if before is None:
            break
    assert pages9 == [9] * 5
    # the conv_id filter pages the same way
    only_ab: list[tuple[str, int]] = []
    before = None
    while True:
        page = await b.search(tag, conv_id=ab, limit=4, before=before)
        only_ab += [(m["conv_id"], m["seq"]) for m in page["results"]]
        before = page["next_before"]
        if before is None:
            break
    assert only_ab == [k for k in order if k[0] == ab]


async def test_pages_stay_exact_when_new_matches_arrive(make: Make) -> None:
    a, b = await make("na"), await make("nb")
    conv = await befriend(a, b)
    tag = _tag()
    seqs = [await _send(a if i % 2 else b, conv, f"{tag} {i}") for i in range(25)]
    await persisted(a, conv, seqs[-1])
    first = await a.search(tag, limit=10)
    assert [m["seq"] for m in first["results"]] == seqs[::-1][:10]
    # new matches, and a recall of one not shown yet, between pages
    new = [await _send(b, conv, f"{tag} new {i}") for i in range(3)]
    await persisted(a, conv, new[-1])
    await a.recall(conv, seqs[5])
    await eventually(lambda: _seqs_is(a, f"{tag} 5", []))
    rest: list[int] = []
    before = first["next_before"]
    while before is not None:
        page = await a.search(tag, limit=10, before=before)
        rest += [m["seq"] for m in page["results"]]
        before = page["next_before"]
    older = [s for s in seqs[::-1][10:] if s != seqs[5]]
    assert rest == older
    assert await _seqs(a, tag) == new[::-1] + seqs[::-1][:10] + older


async def test_limit_default_and_cap(make: Make) -> None:
    a, b = await make("ma"), await make("mb")
    conv = await befriend(a, b)
    tag = _tag()
    seqs = [await _send(a, conv, f"{tag} {i}") for i in range(105)]
    await persisted(a, conv, seqs[-1])
    newest = seqs[::-1]
    default = await a.search(tag)
    assert [m["seq"] for m in default["results"]] == newest[:20] and default["next_before"]
    for limit in (100, 101, 1000, 2**63 - 1):
        page = await a.request("GET", "/v1/search", params={"q": tag, "limit": limit})
        assert [m["seq"] for m in page["results"]] == newest[:100], limit
        assert page["next_before"]
        tail = await a.search(tag, limit=100, before=page["next_before"])
        assert [m["seq"] for m in tail["results"]] == newest[100:]
        assert tail["next_before"] is None
    empty_limit = await a.request("GET", "/v1/search", params={"q": tag, "limit": ""})
    assert empty_limit == default  # an empty limit is no limit, as in history
    one = await a.search(tag, limit=1)
    assert [m["seq"] for m in one["results"]] == newest[:1] and one["next_before"]
    assert len(await a.search_all(tag)) == 105


# -- bad input ---------------------------------------------------------------------------------------


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


async def test_bad_input_is_400(make: Make) -> None:
    a, b = await make("ba"), await make("bb")
    conv = await befriend(a, b)
    tag = _tag()
    seqs = [await _send(a, conv, f"{tag} {i}") for i in range(3)]
    await persisted(a, conv, seqs[-1])
    good = await a.search(tag, limit=1)
    cursor = good["next_before"]
    assert cursor
    decoded = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    t, q, cv = decoded.split(":", 2)
    tampered = cursor[:-1] + ("A" if cursor[-1] != "A" else "B")
    bad_params: list[dict[str, Any]] = [
        {},
        {"q": ""},
        {"q": "   "},
        {"q": "\t\n"},
        {"q": "x" * 257},
        {"q": "世" * 257},
        {"q": tag, "limit": 0},
        {"q": tag, "limit": -1},
        {"q": tag, "limit": "abc"},
        {"q": tag, "limit": "1.5"},
        {"q": tag, "limit": "1e3"},
        {"q": tag, "before": "garbage"},
        {"q": tag, "before": ""},
        {"q": tag, "before": tampered},
        {"q": tag, "before": cursor + "A"},
        {"q": tag, "before": "A" * 129},
        {"q": tag, "before": cursor + "=" * 200},
        {"q": tag, "before": _cursor(f"0{t}:{q}:{cv}")},  # a leading zero
        {"q": tag, "before": _cursor(f"{t}:0:{cv}")},  # seq 0
        {"q": tag, "before": _cursor(f"{t}:-1:{cv}")},
        {"q": tag, "before": _cursor(f"-1:{q}:{cv}")},
        {"q": tag, "before": _cursor(f"{t}:{q}:nonsense")},
        {"q": tag, "before": _cursor(f"{t}:{q}")},
        {"q": tag, "before": _cursor(f" {t}:{q}:{cv}")},
        {"q": tag, "before": _cursor(f"{2**63}:{q}:{cv}")},
        {"q": tag, "before": _cursor(f"{t}:{2**63}:{cv}")},
        {"q": tag, "before": "%%%%"},
        {"q": tag, "before": "/w=="},
    ]
    for params in bad_params:
        with pytest.raises(ApiError) as e:
            await a.request("GET", "/v1/search", params=params)
        assert (e.value.status, e.value.code) == (400, "bad_request"), params
        assert e.value.message, params
    # nothing changed: the same answers as before
    assert await a.search(tag, limit=1) == good
    assert await _seqs(a, tag) == seqs[::-1]
    # the longest q is fine; the cursor as given works
    assert (await a.search("x" * 256))["results"] == []
    assert (await a.search(tag + " " + "y" * (255 - len(tag))))["results"] == []
    nxt = await a.search(tag, limit=5, before=cursor)
    assert [m["seq"] for m in nxt["results"]] == seqs[::-1][1:]


async def test_search_needs_a_token(url: str) -> None:
    for headers in ({}, {"Authorization": "Bearer garbage"}, {"Authorization": "Basic x"}):
        async with HttpPool() as http:
            r = await http.get(url + "/v1/search", params={"q": "hello"}, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "unauthorized"
    anon = Client(url)
    try:
        assert await _error(anon.search("hello")) == (401, "unauthorized")
        # before looking at the query
        assert await _error(anon.search("   ")) == (401, "unauthorized")
    finally:
        await anon.aclose()
