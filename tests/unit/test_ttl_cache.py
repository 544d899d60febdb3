"""``TTLCache``: per-entry expiry on a clock the test moves by hand, drop, the size bound."""

from __future__ import annotations

import pytest

from im_server import context
from im_server.context import TTLCache


class Clock:
    """Stands in for the ``time`` module inside ``context``: only ``monotonic``."""

    def __init__(self) -> None:
        self.now = 500.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(context, "time", c)
    return c


def test_get_and_put(clock: Clock) -> None:
    c = TTLCache(ttl=30)
    assert c.get("a") is None
    c.put("a", 1)
    c.put(("tuple", 2), {"x": 1})
    assert c.get("a") == 1
    assert c.get(("tuple", 2)) == {"x": 1}
    c.put("a", 2)  # replaces
    assert c.get("a") == 2


def test_falsy_values_are_hits(clock: Clock) -> None:
    c = TTLCache(ttl=30)
    c.put("zero", 0)
    c.put("empty", "")
    c.put("no", False)
    assert c.get("zero") == 0 and c.get("empty") == "" and c.get("no") is False


def test_entries_expire_after_the_ttl(clock: Clock) -> None:
    c = TTLCache(ttl=30)
    c.put("a", 1)
    clock.now += 10
    c.put("b", 2)
    clock.now += 20  # a is exactly 30 s old: still valid
    assert c.get("a") == 1
    clock.now += 0.001
    assert c.get("a") is None
    assert c.get("b") == 2
    clock.now += 10
    assert c.get("b") is None


def test_put_renews_the_expiry(clock: Clock) -> None:
    c = TTLCache(ttl=30)
    c.put("a", 1)
    clock.now += 25
    c.put("a", 1)
    clock.now += 25
    assert c.get("a") == 1


def test_an_expired_entry_is_gone_for_good(clock: Clock) -> None:
    c = TTLCache(ttl=1)
    c.put("a", 1)
    clock.now += 2
    assert c.get("a") is None
    clock.now -= 2  # even if the clock could go back, the entry was removed
    assert c.get("a") is None


def test_drop(clock: Clock) -> None:
    c = TTLCache(ttl=30)
    c.put("a", 1)
    c.put("b", 2)
    c.drop("a")
    c.drop("a")  # dropping a missing key is fine
    c.drop("never")
    assert c.get("a") is None
    assert c.get("b") == 2


def test_max_entries_bounds_the_size(clock: Clock) -> None:
    c = TTLCache(ttl=30, max_entries=3)
    for i in range(3):
        c.put(i, i)
    assert [c.get(i) for i in range(3)] == [0, 1, 2]
    c.put(3, 3)  # full: starts over rather than grow
    assert c.get(3) == 3
    present = [i for i in range(3) if c.get(i) is not None]
    assert len(present) + 1 <= 3
    for i in range(4, 100):
        c.put(i, i)
        assert c.get(i) == i  # the newest entry is always kept
        assert sum(c.get(k) is not None for k in range(i + 1)) <= 3


def test_zero_ttl_expires_as_soon_as_time_moves(clock: Clock) -> None:
    c = TTLCache(ttl=0)
    c.put("a", 1)
    assert c.get("a") == 1
    clock.now += 0.001
    assert c.get("a") is None
