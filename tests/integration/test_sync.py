"""Sync (``GET /v1/sync``) against the contract: the snapshot, incremental sync while
messages pour in (the client recipe of ``im_server.client.sync`` misses nothing and keeps
nothing twice, on the same process or another one), long polls, paging with ``limit``,
the safe-version rule made visible with a transaction held open, and visibility windows.

The seed's bug ("the cursor moved before the events were written", 6.2) is what the
concurrent test and the held-transaction test would catch: a version handed out while a
lower one is still uncommitted makes a client skip that change for good."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest

from im_server.client import Client, Connection, SyncState
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    new_user,
    pg_dsn,
    wait_nodes_linked,
)
from tests.support import pg as pg_connection

LONG_POLL_SLACK = 0.25  # scheduling and HTTP on top of the 1 s promise


# --------------------------------------------------------------------------- helpers


def uid(c: Client) -> int:
    assert c.user_id is not None
    return c.user_id


async def persisted(client: Client, conv: str, seq: int, timeout: float = 30.0) -> None:
    """Wait until the persister has written ``conv`` up to ``seq`` (as seen by ``client``)."""

    async def ok() -> bool:
        return (await client.history(conv, limit=1, order="desc"))["max_seq"] >= seq

    await eventually(ok, timeout=timeout)


async def send_all(
    conn: Connection, plan: list[tuple[str, str]], window: int = 8
) -> list[dict[str, Any]]:
    """Send ``plan`` ([(conv_id, text)]) keeping up to ``window`` sends in flight; return
    one record per send: the ack plus what was sent."""
    sem = asyncio.Semaphore(window)
    out: list[dict[str, Any]] = []

    async def one(conv: str, txt: str) -> None:
        try:
            cmid = uuid.uuid4().hex
            fut = await conn.send_nowait(conv, txt, client_msg_id=cmid)
            ack = await asyncio.wait_for(fut, 15.0)
        finally:
            sem.release()
        assert ack["ok"] is True, ack
        out.append({**ack, "client_msg_id": cmid, "text": txt})

    tasks = []
    for conv, txt in plan:
        await sem.acquire()
        tasks.append(asyncio.create_task(one(conv, txt)))
    await asyncio.gather(*tasks)
    return out


async def wait_lock_waiters(
    pg: asyncpg.Connection, n: int, like: str = "%sync_version%", timeout: float = 10.0
) -> None:
    """Until at least ``n`` backends running a statement ``like`` wait for a lock (by
    default: the sync_version row lock)."""

    async def ok() -> bool:
        got = await pg.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE $1",
            like,
        )
        return int(got) >= n

    await eventually(ok, timeout=timeout)


async def blocked_by(
    pg: asyncpg.Connection, holder: int, like: str = "%", timeout: float = 10.0
) -> int:
    """Until a backend running a statement ``like`` waits for a lock that backend
    ``holder`` holds; returns its pid. Naming the holder (not counting waiters) keeps
    the sync point exact when other backends queue for the same lock."""
    got: list[int] = []

    async def ok() -> bool:
        pid = await pg.fetchval(
            "SELECT pid FROM pg_stat_activity "
            "WHERE $1 = ANY(pg_blocking_pids(pid)) AND query ILIKE $2 LIMIT 1",
            holder,
            like,
        )
        if pid is not None:
            got.append(int(pid))
        return pid is not None

    await eventually(ok, timeout=timeout)
    return got[-1]


def by_conv(resp: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {st["conv_id"]: st for st in resp["conversations"]}


def check_answer(resp: dict[str, Any], since: int, recent: int) -> None:
    """Shape rules every sync answer keeps."""
    assert resp["version"] >= since, ("a version never goes back", since, resp["version"])
    for st in resp["conversations"]:
        assert st["version"] > since, ("only states changed after since", since, st)
        msgs = st["messages"]
        seqs = [m["seq"] for m in msgs]
        assert len(msgs) <= recent, (recent, st["conv_id"], seqs)
        assert seqs == sorted(set(seqs)), ("ascending, once each", seqs)
        assert all(st["min_seq"] <= s <= st["max_seq"] for s in seqs), ("inside the window", st)
        assert all(m["conv_id"] == st["conv_id"] for m in msgs)


@dataclass
class Receiver:
    """A device running the recipe by hand, recording everything it was given:
    sync answers, the messages they embedded and the ranges it pulled with history."""

    client: Client
    recent: int = 20
    limit: int = 100
    page: int = 50
    state: SyncState = field(default_factory=SyncState)
    versions: list[int] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)
    reported: list[dict[str, Any]] = field(default_factory=list)  # embedded in sync answers
    pulled: list[dict[str, Any]] = field(default_factory=list)  # from history pulls
    kept: list[Mapping[str, Any]] = field(default_factory=list)  # new to the device, in order
    pull_log: list[tuple[str, int, int, list[int], int]] = field(default_factory=list)

    async def step(self, wait: float | None = None) -> dict[str, Any]:
        """One sync page from the last version, then pull the ranges it says we lack."""
        since = self.state.version
        resp = await self.client.sync(since=since, wait=wait, limit=self.limit, recent=self.recent)
        check_answer(resp, since, self.recent)
        self.versions.append(resp["version"])
        self.answers.append(resp)
        ranges = self.state.apply_sync(resp)
        for st in resp["conversations"]:
            self.reported += st["messages"]
            self.kept += self.state.add_messages(st["messages"])
        for conv, begin, end in ranges:
            await self.pull(conv, begin, end)
        return resp

    async def pull(self, conv: str, begin: int, end: int) -> None:
        """Ascending pages of at most ``page`` seqs (the server keeps the seqs nearest
        ``end`` when more remain, so a page must not span more than ``limit``)."""
        cur = begin
        try:
            while cur <= end:
                hi = min(end, cur + self.page - 1)
                ans = await self.client.history(
                    conv, begin=cur, end=hi, limit=self.page, order="asc"
                )
                self.state.observe_window(conv, min_seq=ans.get("min_seq"))
                self.pulled += ans["messages"]
                got = [int(m["seq"]) for m in ans["messages"]]
                self.pull_log.append((conv, cur, hi, got, int(ans["max_seq"])))
                self.kept += self.state.add_messages(ans["messages"])
                covered = min(hi, int(ans["max_seq"]))
                self.state.mark_pulled(conv, cur, covered)
                if covered < hi:  # not persisted yet: the next sync names it again
                    self.state.release(conv, covered + 1, end)
                    return
                cur = hi + 1
        except BaseException:
            self.state.release(conv, cur, end)
            raise

    async def catch_up(self) -> dict[str, Any]:
        """Sync pages until has_more is false; return the last answer."""
        for _ in range(10_000):
            resp = await self.step()
            if not resp["has_more"]:
                return resp
        raise AssertionError("has_more never ended")

    def explain(self, key: tuple[str, int]) -> list[Any]:
        """The pulls whose range covered ``key``: what the server answered there."""
        conv, seq = key
        return [p for p in self.pull_log if p[0] == conv and p[1] <= seq <= p[2]]

    def union(self) -> dict[tuple[str, int], dict[str, Any]]:
        """What sync reported plus what was pulled, duplicates dropped by (conv_id, seq)."""
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for m in self.reported + self.pulled:
            key = (m["conv_id"], int(m["seq"]))
            if key in out:
                assert out[key]["client_msg_id"] == m["client_msg_id"], (
                    "same seq, other message",
                    m,
                )
            out.setdefault(key, m)
        return out


@pytest.fixture(scope="module")
def second(stores: Stores, server: ServerProcess) -> Iterator[ServerProcess]:
    """A second ``im-server serve`` on the same stores (the ``server`` fixture runs first
    so that the log folder is set)."""
    s2 = ServerProcess(env=stores.env()).start()
    try:
        wait_nodes_linked(server.url, s2.url)
        yield s2
    finally:
        s2.terminate()


@pytest.fixture
async def pg(stores: Stores) -> AsyncIterator[asyncpg.Connection]:
    async with pg_connection(stores) as conn:
        yield conn


@pytest.fixture
async def carol(url: str) -> AsyncIterator[Client]:
    c = await new_user(url, "carol")
    yield c
    await c.aclose()


# --------------------------------------------------------------------------- 1. snapshot


async def test_snapshot_then_nothing_new(url: str) -> None:
    me, a, b = [await new_user(url, p) for p in ("snap", "sa", "sb")]
    try:
        s_a, s_b = await befriend(me, a), await befriend(me, b)
        g = await a.create_group("snapshot", [uid(me), uid(b)])
        counts = {s_a: 3, s_b: 25, g["conv_id"]: 7}
        ca, cb = await a.connect(queue_events=False), await b.connect(queue_events=False)
        try:
            await send_all(
                ca,
                [(s_a, f"a{i}") for i in range(3)] + [(g["conv_id"], f"ga{i}") for i in range(4)],
            )
            await send_all(
                cb,
                [(s_b, f"b{i}") for i in range(25)] + [(g["conv_id"], f"gb{i}") for i in range(3)],
            )
        finally:
            await ca.close()
            await cb.close()
        for conv, n in counts.items():
            await persisted(me, conv, n)

        device = await Client.login(url, str(me.username), PASSWORD, device_id="new-phone")
        try:
            for recent in (5, None):  # None: the default, 20
                snap = await device.sync(0, recent=recent)
                n_recent = recent or 20
                check_answer(snap, 0, n_recent)
                assert snap["version"] > 0
                assert snap["has_more"] is False
                states = by_conv(snap)
                assert set(states) == set(counts), states.keys()
                assert states[g["conv_id"]]["type"] == "group" and states[s_a]["type"] == "single"
                for conv, n in counts.items():
                    st = states[conv]
                    assert st["max_seq"] == n, st
                    full = (await device.history(conv, limit=500))["messages"]
                    assert [m["seq"] for m in st["messages"]] == [m["seq"] for m in full][
                        -n_recent:
                    ]
                    assert st["messages"] == full[-n_recent:], "the same messages as history"
                    assert st["last_message"] == full[-1]
            again = await device.sync(snap["version"])
            assert again == {"version": snap["version"], "conversations": [], "has_more": False}
        finally:
            await device.aclose()
    finally:
        for c in (me, a, b):
            await c.aclose()


# --------------------------------------------------------------------------- 2. THE test


@pytest.mark.parametrize("where", ["same_process", "second_process"])
async def test_incremental_sync_under_concurrent_sends_misses_nothing(
    url: str, where: str, request: pytest.FixtureRequest
) -> None:
    """3 senders, 4 conversations (3 single chats, 1 group), 300 messages sent over
    WebSockets with windows in flight, while the receiver loops on sync(limit=2,
    recent=5) and pulls what it lacks. Everything acked ends up held exactly once."""
    rcv = await new_user(url, "rcv")
    senders = [await new_user(url, f"snd{i}") for i in range(3)]
    clients = [rcv, *senders]
    try:
        singles = [await befriend(s, rcv) for s in senders]
        g = await senders[0].create_group(
            "sync-storm", [uid(rcv), uid(senders[1]), uid(senders[2])]
        )
        group = g["conv_id"]
        device = rcv
        if where == "second_process":
            s2: ServerProcess = request.getfixturevalue("second")
            device = await Client.login(
                s2.url, str(rcv.username), PASSWORD, device_id="other-process"
            )
            clients.append(device)

        rec = Receiver(device, recent=5, limit=2, page=20)
        await rec.catch_up()  # the state before the storm: 4 empty conversations
        before = rec.state.version

        conns = [await s.connect(queue_events=False) for s in senders]
        per = 50  # per sender and conversation: 3 x (50 + 50) = 300
        plans = [
            [(conv, f"{where}-{i}-{conv}-{k}") for k in range(per) for conv in (singles[i], group)]
            for i in range(3)
        ]
        done = asyncio.Event()

        async def receiver_loop() -> None:
            wait: float | None = None
            while not done.is_set():
                resp = await rec.step(wait=wait)
                wait = None if resp["has_more"] else 0.5  # long-poll when caught up

        loop_task = asyncio.create_task(receiver_loop())
        try:
            results = await asyncio.gather(
                *(send_all(c, p) for c, p in zip(conns, plans, strict=True))
            )
        finally:
            for c in conns:
                await c.close()
        acks = {
            (r["conv_id"], r["seq"]): (s.user_id, r)
            for s, rs in zip(senders, results, strict=True)
            for r in rs
        }
        assert len(acks) == 300, "300 distinct (conv_id, seq)"
        tops: dict[str, int] = {}
        for conv, seq in acks:
            tops[conv] = max(tops.get(conv, 0), seq)
        for conv, top in tops.items():
            await persisted(rcv, conv, top)
        done.set()
        await asyncio.wait_for(loop_task, 30)

        last = await rec.catch_up()  # caught up: one more pass after everything is durable
        final = await device.sync(rec.state.version)
        assert final["conversations"] == [] and final["version"] == rec.state.version, final

        # versions handed out never went down
        assert rec.versions == sorted(rec.versions), rec.versions
        assert rec.versions[-1] > before
        assert any(a["has_more"] for a in rec.answers), "limit=2 over 4 conversations must page"
        assert not last["has_more"]
        assert rec.reported and rec.pulled, "recent=5 leaves ranges to pull"

        union = rec.union()
        missing = sorted(set(acks) - set(union))
        assert not missing, (
            f"{len(missing)} acked messages never reached the device: {missing[:20]}; "
            f"pulls over them (conv, begin, end, seqs returned, max_seq in the answer): "
            f"{rec.explain(missing[0])}"
        )
        extra = sorted(set(union) - set(acks))
        assert not extra, f"messages nobody acked: {extra[:20]}"
        for key, (sender_id, ack) in acks.items():
            m = union[key]
            assert m["sender_id"] == sender_id, (key, m)
            assert m["client_msg_id"] == ack["client_msg_id"], (key, m)
            assert m["content"] == {"text": ack["text"]}, (key, m)
        # the recipe kept each message once
        kept = [(m["conv_id"], int(m["seq"])) for m in rec.kept]
        assert len(kept) == len(set(kept)) == 300
        for conv, top in tops.items():
            assert rec.state.contiguous(conv) == top, (conv, rec.state.convs[conv])
    finally:
        for cl in clients:
            await cl.aclose()


# --------------------------------------------------------------------------- 3. long polls


async def test_long_poll_answers_within_a_second_of_a_change(
    pair: tuple[Client, Client, str],
) -> None:
    alice, bob, conv = pair
    v = (await alice.sync(0))["version"]
    assert (await alice.sync(v))["conversations"] == []

    poll = asyncio.create_task(alice.sync(v, wait=5))
    await asyncio.sleep(0.5)  # under test: the poll holds while nothing changes
    assert not poll.done(), "nothing changed: the poll must still be waiting"
    t0 = time.monotonic()
    ack = await bob.send_rest(conv, "wake up")
    resp = await poll
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0 + LONG_POLL_SLACK, f"long poll answered {elapsed:.3f} s after the change"
    st = by_conv(resp)[conv]
    assert st["messages"][-1]["seq"] == ack["seq"]
    assert resp["version"] > v


async def test_long_poll_without_change_answers_at_the_deadline(
    pair: tuple[Client, Client, str],
) -> None:
    alice, _bob, _conv = pair
    v = (await alice.sync(0))["version"]
    t0 = time.monotonic()
    resp = await alice.sync(v, wait=2)
    elapsed = time.monotonic() - t0
    assert 1.9 <= elapsed < 3.0, elapsed
    assert resp == {"version": v, "conversations": [], "has_more": False}


async def test_long_poll_on_another_process(
    pair: tuple[Client, Client, str], second: ServerProcess
) -> None:
    """The poll waits on server 2; the changes go through server 1 (a message, whose
    persister may run on either process, and a clear, committed by server 1)."""
    alice, bob, conv = pair
    far = await Client.login(second.url, str(alice.username), PASSWORD, device_id="far")
    try:
        v = (await far.sync(0))["version"]
        for change in ("message", "clear"):
            poll = asyncio.create_task(far.sync(v, wait=5))
            await asyncio.sleep(0.5)  # under test: the poll holds while nothing changes
            assert not poll.done()
            t0 = time.monotonic()
            if change == "message":
                await bob.send_rest(conv, "across")
            else:
                await alice.clear(conv)
            resp = await poll
            elapsed = time.monotonic() - t0
            assert elapsed < 1.0 + LONG_POLL_SLACK, f"{change}: answered after {elapsed:.3f} s"
            assert conv in by_conv(resp), resp
            v = resp["version"]
            # drain: the clear answer may be preceded by the read-cursor flush etc.
            while (more := await far.sync(v))["conversations"]:
                v = more["version"]
    finally:
        await far.aclose()


# --------------------------------------------------------------------------- 4. paging


async def _five_friends(url: str, me: Client) -> tuple[list[Client], list[str]]:
    friends = [await new_user(url, f"f{i}") for i in range(5)]
    convs = [await befriend(me, f) for f in friends]
    return friends, convs


async def _pages(client: Client, since: int, limit: int) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    while True:
        resp = await client.sync(since, limit=limit)
        check_answer(resp, since, 20)
        pages.append(resp)
        assert len(pages) < 20, "has_more never ended"
        if not resp["has_more"]:
            return pages
        assert resp["version"] > since, "has_more with a version that does not move on"
        since = resp["version"]


async def test_limit_pages_with_has_more(url: str) -> None:
    me = await new_user(url, "pager")
    friends, convs = await _five_friends(url, me)
    try:
        v0 = (await me.sync(0))["version"]
        sent = {}
        for f, conv in zip(friends, convs, strict=True):  # one after the other: 5 versions
            ack = await f.send_rest(conv, f"hello from {f.user_id}")
            await persisted(me, conv, ack["seq"])
            sent[conv] = ack
        pages = await _pages(me, v0, limit=2)
        assert [p["has_more"] for p in pages] == [True, True, False], pages
        assert [len(p["conversations"]) for p in pages] == [2, 2, 1]
        seen = [st["conv_id"] for p in pages for st in p["conversations"]]
        assert sorted(seen) == sorted(convs), "every changed state, once"
        versions = [p["version"] for p in pages]
        assert versions == sorted(versions)
        for p in pages:
            for st in p["conversations"]:
                assert st["messages"][-1]["client_msg_id"] == sent[st["conv_id"]]["client_msg_id"]
        assert (await me.sync(versions[-1]))["conversations"] == []
    finally:
        for c in (me, *friends):
            await c.aclose()


async def test_limit_cut_at_a_version_shared_by_many_states(
    url: str, pg: asyncpg.Connection
) -> None:
    """A version can stamp several states at once (one persister batch touching many of
    my conversations): a page is cut at a version boundary, never inside one, so that no
    state is skipped. Changes: c0 (clear), c1..c3 (one shared version), c4 (clear)."""
    me = await new_user(url, "shared")
    friends, convs = await _five_friends(url, me)
    try:
        v0 = (await me.sync(0))["version"]
        await me.clear(convs[0])
        async with pg.transaction():
            held = await pg.fetchval(
                "UPDATE sync_version SET version = version + 1 WHERE id = 1 RETURNING version"
            )
            await pg.execute(
                "UPDATE conv_members SET version = $1 WHERE user_id = $2 AND conv_id = ANY($3::text[])",
                held,
                me.user_id,
                convs[1:4],
            )
        await me.clear(convs[4])
        pages = await _pages(me, v0, limit=2)
        seen = [st["conv_id"] for p in pages for st in p["conversations"]]
        assert sorted(seen) == sorted(convs), f"a state was lost or repeated: {seen}"
        versions = [p["version"] for p in pages]
        assert versions == sorted(versions)
        assert pages[-1]["has_more"] is False
        shared = [
            p for p in pages if {st["conv_id"] for st in p["conversations"]} & set(convs[1:4])
        ]
        assert len(shared) == 1, "the states of one version come in one page"
        assert shared[0]["version"] >= held
    finally:
        for c in (me, *friends):
            await c.aclose()


# --------------------------------------------------------------------------- 5. safe version


async def test_no_version_at_or_below_an_answer_appears_later(
    pair: tuple[Client, Client, str], carol: Client, stores: Stores, pg: asyncpg.Connection
) -> None:
    """Hold a version in an open transaction: sync must answer below it, and once it
    commits, the next sync from that answer reports its change (and the change that
    queued behind it)."""
    alice, bob, conv1 = pair
    conv2 = await befriend(alice, carol)
    v = (await alice.sync(0))["version"]
    ack = await bob.send_rest(conv1, "committed before the hold")
    await persisted(alice, conv1, ack["seq"])

    watcher = await asyncpg.connect(pg_dsn(stores))
    tx = pg.transaction()
    await tx.start()
    committed = False
    clear_task: asyncio.Task[Any] | None = None
    try:
        held = await pg.fetchval(
            "UPDATE sync_version SET version = version + 1 WHERE id = 1 RETURNING version"
        )
        clear_task = asyncio.create_task(alice.clear(conv1))
        await wait_lock_waiters(watcher, 1)
        await asyncio.sleep(0.2)  # under test: the clear stays queued (a negative over time)
        assert not clear_task.done(), "the clear must queue behind the held version"

        mid = await alice.sync(v)
        assert mid["version"] < held, (
            "answered a version at or above one still in flight",
            mid["version"],
            held,
        )
        states = by_conv(mid)
        assert conv1 in states and states[conv1]["messages"][-1]["seq"] == ack["seq"]
        assert conv2 not in states

        await pg.execute(
            "UPDATE conv_members SET version = $1 WHERE conv_id = $2 AND user_id = $3",
            held,
            conv2,
            alice.user_id,
        )
        await tx.commit()
        committed = True
        cleared = await asyncio.wait_for(clear_task, 10)

        after = await alice.sync(mid["version"])
        states = by_conv(after)
        assert conv2 in states, f"the change held at version {held} was skipped"
        assert states[conv2]["version"] >= held
        assert conv1 in states and states[conv1]["min_seq"] == cleared["min_seq"], states.get(conv1)
        assert after["version"] >= held + 1, (after["version"], held)
    finally:
        if not committed:
            await tx.rollback()
        if clear_task is not None and not clear_task.done():
            await asyncio.wait([clear_task], timeout=10)
        await watcher.close()


# --------------------------------------------------------------------------- 6. windows


async def test_kicked_member_sees_inactive_state_and_nothing_after(
    alice: Client, bob: Client, carol: Client
) -> None:
    g = await alice.create_group("kick", [uid(bob), uid(carol)])
    conv, gid = g["conv_id"], g["group_id"]
    ca = await alice.connect(queue_events=False)
    try:
        for i in range(3):
            await ca.send(conv, f"before {i}")
        await persisted(bob, conv, 3)
        vb = (await bob.sync(0))["version"]
        await alice.kick(gid, uid(bob))
        for i in range(3):
            await ca.send(conv, f"after {i}")
        await persisted(alice, conv, 7)  # 3, the kick notice, 3
    finally:
        await ca.close()

    for since in (0, vb):
        resp = await bob.sync(since, recent=100)
        st = by_conv(resp)[conv]
        assert st["active"] is False, st
        assert st["max_seq"] == 3, st
        assert [m["seq"] for m in st["messages"]] == [1, 2, 3]
        assert all("after" not in str(m["content"]) for m in st["messages"])
    later = await bob.sync(resp["version"], recent=100)
    for st in later["conversations"]:
        assert all(m["seq"] <= 3 for m in st["messages"]), st
    # the remaining members see everything
    assert by_conv(await carol.sync(0, recent=100))[conv]["max_seq"] == 7


@pytest.fixture
def solo(
    tmp_path_factory: pytest.TempPathFactory, server: ServerProcess
) -> Iterator[tuple[Stores, ServerProcess]]:
    """Dedicated stores with exactly one server process, hence one persister: the test
    below orders transactions on the version row and must know who is waiting there."""
    st = Stores.start(tmp_path_factory.mktemp("solo"))
    srv: ServerProcess | None = None
    try:
        srv = ServerProcess(env=st.env()).start()
        yield st, srv
    finally:
        if srv is not None:
            srv.terminate()
        st.stop()


async def test_kicked_member_learns_its_window_end_persisted_after_the_kick(
    solo: tuple[Stores, ServerProcess],
) -> None:
    """A message acked before the kick but persisted after it lies inside the kicked
    member's window: its sync must tell it, or the recipe never pulls that seq.

    The hard order, made exact with three held locks, each sync point naming the backend
    it waits for: m1's batch starts its statement (its snapshot) while the kick is
    still open, takes its version after the kick committed, and stays uncommitted while
    the kicked device syncs. So the batch's own statement cannot see the kick; the
    persisted window end must still reach the device once m1 is written."""
    stores, srv = solo
    alice, bob, carol = [await new_user(srv.url, p) for p in ("ka", "kb", "kc")]
    g = await alice.create_group("kick-race", [uid(bob), uid(carol)])
    conv, gid = g["conv_id"], g["group_id"]
    ca = await alice.connect(queue_events=False)
    table, conv_row, member_row, watcher = [await asyncpg.connect(pg_dsn(stores)) for _ in range(4)]
    open_tx: dict[asyncpg.Connection, Any] = {}
    kick: asyncio.Task[Any] | None = None

    async def hold(conn: asyncpg.Connection, sql: str, *args: Any) -> int:
        """Run ``sql`` in a transaction left open; returns the holding backend's pid."""
        tx = open_tx[conn] = conn.transaction()
        await tx.start()
        await conn.execute(sql, *args)
        return int(await conn.fetchval("SELECT pg_backend_pid()"))

    async def release(conn: asyncpg.Connection) -> None:
        await open_tx.pop(conn).rollback()

    try:
        first = await ca.send(conv, "persisted before the kick")
        await persisted(bob, conv, first["seq"])
        rec = Receiver(bob, recent=100)
        await rec.catch_up()

        # no batch statement can start: it waits for the table before its snapshot
        await hold(table, "LOCK TABLE messages IN SHARE MODE")
        m1 = await ca.send(conv, "m1")  # acked before the kick: inside bob's window
        conv_pid = await hold(
            conv_row, "SELECT 1 FROM conversations WHERE conv_id = $1 FOR UPDATE", conv
        )
        member_pid = await hold(
            member_row,
            "SELECT 1 FROM conv_members WHERE conv_id = $1 AND user_id = $2 FOR UPDATE",
            conv,
            bob.user_id,
        )
        kick = asyncio.create_task(alice.kick(gid, bob.user_id))  # type: ignore[arg-type]
        kick_pid = await blocked_by(watcher, member_pid)  # the kick holds its version
        await release(table)  # m1's batch starts: its snapshot predates the kick's commit
        await blocked_by(watcher, kick_pid, like="%INSERT INTO messages%")
        await release(member_row)  # the kick commits, then m1's batch takes its version
        await asyncio.wait_for(kick, 10)
        # m1's batch, with a version above the kick's, waits for the conversation row
        await blocked_by(watcher, conv_pid, like="%INSERT INTO messages%")

        mid = await rec.step()  # what the kicked device sees right after the kick
        st = by_conv(mid)[conv]
        assert st["active"] is False, st
        assert st["max_seq"] < m1["seq"], ("m1 is not persisted yet", st)
        await release(conv_row)  # m1 is written
        await persisted(alice, conv, m1["seq"])

        # the device long-polls from where it stopped, as the recipe does: the state
        # change that names the filled window (its own version, after m1's batch) wakes it
        deadline = time.monotonic() + 10
        while m1["seq"] not in {seq for c, seq in rec.union() if c == conv}:
            if time.monotonic() > deadline:
                break
            await rec.step(wait=2)
        await rec.catch_up()
        held = {seq for c, seq in rec.union() if c == conv}
        final = by_conv(await bob.sync(0, recent=100))[conv]
        assert final["max_seq"] >= m1["seq"], ("m1 is inside the kicked member's window", final)
        assert m1["seq"] in held, (
            f"seq {m1['seq']} (acked before the kick, inside the window, max_seq "
            f"{final['max_seq']}) never reached the kicked member's device: the sync at "
            f"version {mid['version']} said max_seq {st['max_seq']} and no later sync named "
            f"the conversation again (its state version stays {final['version']})"
        )
    finally:
        for conn in list(open_tx):
            await release(conn)
        if kick is not None and not kick.done():
            await asyncio.wait([kick], timeout=10)
        await ca.close()
        for conn in (table, conv_row, member_row, watcher):
            await conn.close()
        for c in (alice, bob, carol):
            await c.aclose()


async def test_hidden_conversation_appears_with_hidden_true(
    pair: tuple[Client, Client, str],
) -> None:
    alice, bob, conv = pair
    ack = await bob.send_rest(conv, "before hiding")
    await persisted(alice, conv, ack["seq"])
    v = (await alice.sync(0))["version"]
    await alice.hide(conv)
    resp = await alice.sync(v)
    st = by_conv(resp)[conv]
    assert st["hidden"] is True, st
    assert conv not in {s["conv_id"] for s in await alice.conversations()}
    ack2 = await bob.send_rest(conv, "brings it back")
    await persisted(alice, conv, ack2["seq"])
    st = by_conv(await alice.sync(resp["version"]))[conv]
    assert st["hidden"] is False, st
    assert st["messages"][-1]["seq"] == ack2["seq"]
