"""Prometheus metrics (prometheus-client, default registry, served at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SENDS = Counter("im_sends_total", "Send attempts by outcome", ["outcome"])
SEND_LATENCY = Histogram(
    "im_send_seconds",
    "Time from a validated send to its ack",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
PUSHES = Counter("im_pushes_total", "Frames queued to live connections")
DROPPED_SLOW = Counter(
    "im_dropped_slow_consumers_total", "Connections closed because their send queue was full"
)
CONNECTIONS = Gauge("im_connections", "Open WebSocket connections in this process")
PERMISSION_LOOKUP_FAILURES = Counter(
    "im_permission_lookup_failures_total",
    "Friendship/block/membership lookups that failed (sends let through)",
)
STORE_ERRORS = Counter("im_store_errors_total", "Store calls that failed", ["store"])
PERSISTED = Counter(
    "im_persisted_messages_total", "Messages written to PostgreSQL by the persister"
)
PERSIST_BATCH = Histogram(
    "im_persist_batch_size",
    "Messages per persister batch",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
)
PERSIST_LAG = Histogram(
    "im_persist_lag_seconds",
    "Time from ack (server_time) to commit in PostgreSQL",
    buckets=(
        0.001,
        0.002,
        0.005,
        0.01,
        0.02,
        0.03,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.25,
        0.3,
        0.5,
        0.75,
        1,
        2,
        5,
        10,
        30,
    ),
)
STREAM_DEPTH = Gauge("im_stream_depth", "Entries waiting in the message streams")
PERIODIC_FAILURES = Counter(
    "im_periodic_failures_total", "Failed runs of periodic background jobs", ["job"]
)
OUTBOX_DEFERRED = Counter(
    "im_outbox_deferred_total",
    "Notices whose send after the commit failed on a store, left to the outbox sweep",
)
OUTBOX_REFUSED = Counter(
    "im_outbox_refused_total", "Notices the send pipeline refused for good (dropped, logged)"
)
OUTBOX_SWEPT = Counter(
    "im_outbox_swept_total", "Notices sent by the outbox sweep (their request did not send them)"
)
READ_FLUSHES = Counter("im_read_flushes_total", "Read-cursor batches written to PostgreSQL")
READ_FLUSH_ROWS = Counter("im_read_flush_rows_total", "Cursor rows written by read-cursor batches")
BAD_FRAMES = Counter("im_bad_frames_total", "WebSocket frames refused", ["code"])
DEDUPE_CONFLICTS = Counter(
    "im_dedupe_conflicts_total",
    "Queued messages not stored because PostgreSQL already held their dedupe key",
)
PERSIST_POISON = Counter(
    "im_persist_unstorable_total",
    "Messages whose content the database refused (stored with a placeholder)",
)
LOGINS = Counter("im_logins_total", "Login attempts by outcome", ["outcome"])
QUOTA_UNAVAILABLE = Counter(
    "im_quota_unavailable_total",
    "Lookups, registrations and friend requests let through uncounted because Redis "
    "could not be reached",
    ["what"],
)
LOGIN_THROTTLE_UNAVAILABLE = Counter(
    "im_login_throttle_unavailable_total",
    "Logins and password checks let through unthrottled because Redis could not be reached",
)
TOKEN_RECHECKS = Counter(
    "im_token_rechecks_total", "Periodic re-checks of the open WebSockets' tokens", ["outcome"]
)
TOKEN_RECHECK_CLOSED = Counter(
    "im_token_recheck_closed_total",
    "WebSockets closed (4401) by the periodic re-check: their token was revoked or idle",
)
WS_HANDLER_ERRORS = Counter(
    "im_ws_handler_errors_total",
    "Bugs in the WebSocket handlers (exceptions other than refusals, store faults and "
    "clients that went away), by where they happened",
    ["where"],
)
STORE_UNAVAILABLE_ANSWERS = Counter(
    "im_http_unavailable_total",
    "REST requests answered 503 unavailable (a store down, slow or saturated)",
)
HTTP_HANDLER_ERRORS = Counter(
    "im_http_handler_errors_total",
    "Bugs in REST handlers (an unexpected exception answered 500, logged with its traceback)",
)
PHONE_PUSHES = Counter(
    "im_phone_pushes_total",
    "Notifications posted to the push gateway, by kind (message, badge) and result "
    "(sent, retry: the gateway failed and it will be posted again, dropped: refused as a request)",
    ["kind", "result"],
)
PHONE_PUSH_REJECTED = Counter(
    "im_phone_push_rejected_pushkeys_total",
    "Pushkeys the gateway rejected (their registrations deleted)",
)
PHONE_PUSH_LATENCY = Histogram(
    "im_phone_push_latency_seconds",
    "From a message's server time (its ack) to the gateway's answer to its push",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
PHONE_PUSH_LAG = Gauge(
    "im_phone_push_lag_seconds",
    "Age of the oldest message a pusher took from the push outbox in its last round "
    "(0 when it found none): how far pushes are behind",
)
PHONE_PUSH_BACKOFF = Gauge(
    "im_phone_push_backoff_seconds", "The pusher's current back-off from a failing gateway"
)
UPLOADS = Counter(
    "im_uploads_total",
    "Uploads by event: created (a presigned PUT handed out), expired (never sent, deleted)",
    ["event"],
)
THUMBNAILS = Counter("im_thumbnails_total", "Thumbnails by result (done, failed)", ["result"])
FANOUT_SHED = Counter(
    "im_fanout_shed_total",
    "Recipient frames dropped from the queue to other processes (it was full); their "
    "devices catch up by sync",
)
RATE_SHARED_FAILURES = Counter(
    "im_rate_shared_failures_total",
    "Shared rate checks that Redis could not answer (the request was let through)",
)
WEBHOOK_DELIVERIES = Counter(
    "im_webhook_deliveries_total",
    "Webhook delivery attempts by webhook and outcome: delivered, retry (failed, to be "
    "tried again), failed (given up after the retry window)",
    ["webhook", "outcome"],
)
WEBHOOK_LAG = Histogram(
    "im_webhook_delivery_lag_seconds",
    "From an event's commit to its receiver's acknowledgement, per webhook",
    ["webhook"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600, 86400),
)
WEBHOOK_DEPTH = Gauge(
    "im_webhook_queue_depth", "Pending webhook deliveries, per webhook", ["webhook"]
)
WEBHOOK_OLDEST = Gauge(
    "im_webhook_oldest_pending_seconds",
    "Age of the oldest pending delivery, per webhook (0 when none): how far it is behind",
    ["webhook"],
)
BEFORE_SEND_SECONDS = Histogram(
    "im_before_send_seconds",
    "The before-send hook's answer time (calls made, not decisions remembered)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BEFORE_SEND_DECISIONS = Counter(
    "im_before_send_decisions_total",
    "Before-send decisions: allow, reject, replace (the hook's), remembered (a repeat), "
    "failed_allow / failed_reject (no usable answer: the failure policy), breaker_open "
    "(the hook is failing: the policy without a call)",
    ["decision"],
)
