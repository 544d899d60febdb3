"""One scenario from start to verdict: load -> kill -9 -> restart -> load -> stop ->
settle -> verify (see :mod:`im_server.bench.chaos`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

from im_server.bench.chaos.checks import check_history, check_resends, verify
from im_server.bench.chaos.load import Load
from im_server.bench.chaos.params import SCENARIOS, Params
from im_server.bench.chaos.report import Result
from im_server.bench.chaos.rig import Monitor, Rig
from im_server.client import Client

PASSWORD = "password-1234"


async def _befriend(a: Client, b: Client) -> str:
    """The single chat of two new friends."""
    return await b.accept_friend(await a.request_friend(int(b.user_id or 0)))


async def _setup_users(url: str) -> tuple[list[Client], dict[int, list[str]], list[str]]:
    """Users A-D: single chats A-B and C-D, and a group of the four."""
    users = [await Client.register(url, f"ch{k}{uuid.uuid4().hex[:10]}", PASSWORD) for k in "abcd"]
    ab = await _befriend(users[0], users[1])
    cd = await _befriend(users[2], users[3])
    g = await users[0].create_group("chaos", [int(u.user_id or 0) for u in users[1:]])
    grp = str(g["conv_id"])
    convs = {0: [ab, grp], 1: [ab, grp], 2: [cd, grp], 3: [cd, grp]}
    return users, convs, [ab, cd, grp]


async def run_scenario(scenario: str, root: Path, p: Params) -> Result:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {SCENARIOS}")
    res = Result(scenario)
    rig = Rig(root, scenario, p)
    load: Load | None = None
    mon: Monitor | None = None
    users: list[Client] = []
    try:
        await asyncio.to_thread(rig.start)
        users, convs, all_convs = await _setup_users(rig.urls[-1])
        # users A, B on the first gateway (the one a gateway scenario kills), C, D on the last
        urls = rig.urls
        load = Load(users, convs, urls, p)
        for i in range(len(users)):
            load.url_idx[i] = 0 if i < 2 else len(urls) - 1
        mon = Monitor(rig)
        mon.start()

        t0 = time.monotonic()
        load.start()
        await asyncio.sleep(p.pre_s)

        # ---- the crash
        xlen, pending = await mon.stream_state()
        res.stream_at_kill, res.pending_at_kill = xlen, pending
        res.killed = await rig.kill()
        t_kill = load.t_kill = time.monotonic()
        if rig.pending_at_kill is not None:
            res.pending_at_kill = rig.pending_at_kill
        res.t_kill_s = t_kill - t0
        prekill = load.ok_acked(before=t_kill)
        res.acked_at_kill = len(prekill)
        mon.watch = [(s.sender, c) for c, s in prekill.items()]
        if scenario != "gateway":
            await asyncio.sleep(p.down_s)
        await asyncio.to_thread(rig.restart)
        t_restart = time.monotonic()
        res.restart_s = t_restart - t_kill
        load.urls[:] = rig.urls  # same ports; a restarted gateway is a new process

        # ---- recovery: the first ok ack received after the restart, then more load
        deadline = t_restart + p.recover_timeout
        while time.monotonic() < deadline:
            after = [t for t in load.ack_times[-200:] if t >= t_restart]
            if after:
                res.first_ack_s = min(after) - t_kill
                res.recovered = True
                break
            await asyncio.sleep(0.02)
        if res.recovered:
            await asyncio.sleep(p.post_s)
        t_stop = time.monotonic()
        finished = await load.stop(p.finish_timeout)
        if not finished:
            load.note_error("load:finish_timeout")

        # ---- settle: stream empty, every ack in PostgreSQL (those that can be)
        acked = load.ok_acked()
        keys = [(s.sender, c) for c, s in acked.items()]
        deadline = time.monotonic() + p.settle_timeout
        while time.monotonic() < deadline:
            xlen, _pending = await mon.stream_state()
            cnt = await mon.count_in_pg(keys)
            if xlen == 0 and cnt is not None:
                if cnt == len(keys) or scenario == "redis-empty":
                    res.settled = True
                    res.drain_s = time.monotonic() - t_stop
                    break
            await asyncio.sleep(0.1)
        if not res.settled:
            res.stream_diag = await rig.stream_diag()
        await mon.stop()

        # ---- resends of old client_msg_ids: duplicate, first seq
        await check_resends(rig, load, users, prekill, t_restart, res)

        # ---- verification against PostgreSQL
        await verify(rig, load, all_convs, t_kill, t_restart, prekill, res, mon)
        # history (REST) equals PostgreSQL, one member per conversation
        await check_history(rig, users, all_convs, res)
        res.errors = dict(sorted(load.errors.items()))
        res.exited = rig.unexpected_exits()
    finally:
        if load is not None and not load.stopping:
            load.hard_stop = True
            with contextlib.suppress(Exception):
                await load.stop(5)
        if mon is not None:
            await mon.stop()
        for u in users:
            with contextlib.suppress(Exception):
                await u.aclose()
        res.logs = rig.logs()
        await asyncio.to_thread(rig.stop)
    return res
