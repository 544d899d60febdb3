"""What a chaos run is made of: the scenarios, the stream it watches, and its knobs."""

from __future__ import annotations

from dataclasses import dataclass

SCENARIOS = ("gateway", "persister", "persister-rename", "redis", "postgres", "redis-empty")
STREAM = "im:stream:{p0}"
GROUP = "persist"


@dataclass
class Params:
    pre_s: float = 4.0  # load before the kill
    down_s: float = 0.5  # a store stays dead this long before it is restarted
    post_s: float = 3.0  # load after the first ok ack that follows the restart
    window: int = 8  # sends in flight per sender
    rate: float = 0.0  # new sends per second per sender; 0 = as fast as acks come back
    read_interval: float = 0.05  # per user, between two read reports
    ack_timeout: float = 5.0  # an unanswered send is retried (same client_msg_id) after this
    recover_timeout: float = 60.0  # no ok ack this long after the restart = not recovered
    finish_timeout: float = 30.0  # after the load stops, retries must be answered by then
    settle_timeout: float = 60.0  # stream drained and history complete by then
    claim_idle_ms: int = 2000
    resend_sample: int = 20
