"""Token buckets (``Buckets``) on a clock the test moves by hand."""

from __future__ import annotations

import pytest

from im_server.context import limits as ratelimit
from im_server.context.limits import Buckets
from im_server.errors import ImError


class Clock:
    """Stands in for the ``time`` module inside ``ratelimit``: only ``monotonic``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(ratelimit, "time", c)
    return c


def takes(b: Buckets, key: int, n: int) -> int:
    """How many of n takes in a row succeed."""
    return sum(b.take(key) for _ in range(n))


def test_a_new_key_has_a_full_burst(clock: Clock) -> None:
    b = Buckets(rate=1.0, burst=5)
    assert takes(b, 1, 5) == 5
    assert b.take(1) is False


def test_refill_at_the_rate_and_never_above_the_burst(clock: Clock) -> None:
    b = Buckets(rate=4.0, burst=5)
    assert takes(b, 1, 10) == 5
    clock.now += 0.5  # 2 tokens
    assert takes(b, 1, 5) == 2
    clock.now += 0.2  # 0.8 token: not enough
    assert b.take(1) is False
    clock.now += 0.05  # 0.8 + 0.2 = 1
    assert b.take(1) is True
    clock.now += 3600  # a long idle refills to the burst, not beyond
    assert takes(b, 1, 10) == 5


def test_a_refused_take_costs_nothing(clock: Clock) -> None:
    b = Buckets(rate=1.0, burst=1)
    assert b.take(1) is True
    clock.now += 0.5
    for _ in range(100):
        assert b.take(1) is False  # hammering does not push the next token further away
    clock.now += 0.5
    assert b.take(1) is True


def test_cost(clock: Clock) -> None:
    b = Buckets(rate=1.0, burst=10)
    assert b.take(1, cost=7) is True
    assert b.take(1, cost=4) is False
    assert b.take(1, cost=3) is True
    assert b.take(1, cost=0.5) is False


def test_keys_are_isolated(clock: Clock) -> None:
    b = Buckets(rate=1.0, burst=3)
    assert takes(b, 1, 10) == 3
    assert takes(b, 2, 10) == 3
    assert takes(b, 3, 1) == 1
    clock.now += 1
    assert takes(b, 1, 10) == 1
    assert takes(b, 3, 10) == 3


@pytest.mark.parametrize("burst", [0, 0.5, -3])
def test_the_burst_is_at_least_one(clock: Clock, burst: float) -> None:
    b = Buckets(rate=1.0, burst=burst)
    assert b.burst == 1.0
    assert takes(b, 1, 3) == 1


@pytest.mark.parametrize("rate", [0, -1])
def test_a_rate_of_zero_or_less_disables_the_limit(clock: Clock, rate: float) -> None:
    b = Buckets(rate=rate, burst=1)
    assert takes(b, 1, 1000) == 1000
    b.check(1, "sends")  # does not raise


def test_check_raises_rate_limited(clock: Clock) -> None:
    b = Buckets(rate=1.0, burst=2)
    b.check(1, "sends")
    b.check(1, "sends")
    with pytest.raises(ImError) as exc:
        b.check(1, "sends")
    assert exc.value.code == "rate_limited"
    assert exc.value.status == 429
    assert exc.value.message == "too many sends; slow down"
    b.check(2, "sends")  # another user is not affected
    clock.now += 1
    b.check(1, "sends")


def test_memory_is_bounded(clock: Clock) -> None:
    """Past 200,000 keys the table starts over (a limited key gets a fresh bucket)."""
    b = Buckets(rate=1.0, burst=1)
    assert b.take(0) is True and b.take(0) is False
    for key in range(1, 200_001):
        b.take(key)
    assert b.take(0) is True
