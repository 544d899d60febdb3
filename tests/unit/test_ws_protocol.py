"""The lean WebSocket protocol's two waits behave as the asyncio objects they replace."""

from __future__ import annotations

import asyncio

import pytest

from im_server.transport.ws_protocol import Inbox, Writable


async def test_inbox_is_first_in_first_out_and_wakes_its_reader() -> None:
    box = Inbox()
    assert box.empty()
    box.put_nowait(1)
    box.put_nowait(2)
    assert not box.empty()
    assert await box.get() == 1
    assert await box.get() == 2
    assert box.empty()
    reader = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    assert not reader.done()
    box.put_nowait(3)
    assert await asyncio.wait_for(reader, 1) == 3


async def test_inbox_get_cancelled_loses_nothing() -> None:
    box = Inbox()
    reader = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    box.put_nowait("x")
    assert await box.get() == "x"


async def test_writable_wait_returns_at_once_when_set_and_waits_when_cleared() -> None:
    w = Writable()
    assert w.is_set()
    assert await w.wait()
    w.clear()
    assert not w.is_set()
    waiters = [asyncio.create_task(w.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(t.done() for t in waiters)
    w.set()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1) == [True, True, True]


async def test_writable_cancelled_waiter_is_forgotten() -> None:
    w = Writable()
    w.clear()
    t = asyncio.create_task(w.wait())
    await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    w.set()
    assert w.is_set()
