"""The Redis key layout, in one place: Python builds keys from these templates, and the
send script gets the per-send ones from here (``send_key_pieces``) instead of spelling
them.

Keys that one script call touches together share one hash tag, so the layout maps onto
Redis Cluster slots: a conversation's keys (seq counter, permission cache, refill lock)
and the dedupe keys of sends to it carry its partition's tag ``{p<N>}`` (``N =
crc32(conv_id) mod IM_STREAM_PARTITIONS``), the tag of the partition's stream and boot
marker. A batch of sends is split by partition and each call stays in one slot.

A template holds ``%s`` where its parts go. Python fills it with ``%``; the script gets
the pieces around the ``%s`` and joins them with the parts (Lua's ``..`` is about twice
as fast as its ``string.format`` and this runs for every send)."""

from __future__ import annotations

import functools
import zlib

# present while the partition's slot holds our data; gone after a flush or a new Redis
BOOT = "im:boot:{p%s}"
PARTITIONS = "im:partitions"  # the stream partition count this keyspace was made with
COLD_UNTIL = "im:coldu"  # ms timestamp: until then, dedupe misses are checked in PostgreSQL
NODES = "im:nodes"  # zset node -> expiry (ms), the live gateway processes
CONTROL = "im:ctl"  # pub/sub: cache invalidations, node joins
GROUP = "persist"  # the persister's consumer group
LONG_POLLS = "im:lp"  # zset user_id -> expiry (ms): users with a long poll waiting somewhere

# a conversation's keys: its partition's tag, then the conversation
SEQ = "im:seq:{p%s}:%s"  # hash cur, lim, rid: the conversation's seq counter and its block
PERM = "im:perm:{p%s}:%s"  # hash user_id -> "ok" | refusal code; "_l" = loaded
PERM_EPOCH = "im:pe:{p%s}:%s"  # bumped by every change of the rights in the conversation
SEQ_LOCK = "im:seqlk:{p%s}:%s"  # one seq-block refill at a time per conversation
# (sender, client_msg_id) -> "conv|seq|server_time", with a TTL, in the partition of the
# conversation the send went to (exact while a client does not reuse a client_msg_id in
# another partition; PostgreSQL's unique key is the last guard)
DEDUPE = "im:dd:{p%s}:%s:%s"
STREAM = "im:stream:{p%s}"  # a stream partition
PERSISTER_LEASE = "im:plk:{p%s}"  # who persists the partition
# pub/sub: a gateway node's inbox is this prefix and the node's name (sharded pub/sub on
# a Cluster: the channel lives on the shard of its slot, not on every node)
INBOX = "im:in:"
# + user_id: zset node -> expiry (ms), the nodes holding a socket or long poll of the user
# (one key per user: a lookup for many users goes to every shard at once, in parallel)
USER_NODES = "im:loc:"

# presence (the scripts get these prefixes from ``PRESENCE_PIECES``): one fixed hash tag
# ``{pr}`` for all of them, since one script call records a batch of users and the sweep
# walks a dead node's users (a tag per user would spread a call over many slots);
# connects and disconnects, not messages, drive their write rate, so one slot carries it
PRESENCE_NODES = "im:pn:{pr}"  # zset node -> expiry (ms): processes whose entries count
PRESENCE_PENDING = "im:pq:{pr}"  # zset user_id -> due (ms): offlines not announced yet
PRESENCE_USER = "im:pu:{pr}:"  # + user_id: set of the nodes holding a connection of the user
PRESENCE_NODE = "im:ph:{pr}:"  # + node: set of the users with a connection on that node
LAST_SEEN = "im:ls:{pr}:"  # + user_id: ms when the user's last connection closed (long TTL)
# + user_id: hash node -> the user's device ids with an open socket on that node, joined
# by spaces (device ids never hold one); counts only while the node is live, like the above
PRESENCE_DEVICES = "im:pd:{pr}:"
PRESENCE_PIECES = (
    PRESENCE_NODES,
    PRESENCE_PENDING,
    PRESENCE_USER,
    PRESENCE_NODE,
    LAST_SEEN,
    PRESENCE_DEVICES,
)

# the templates the send script builds its per-send keys from, with the partition filled
# in, and their pieces in its ARGV order: dedupe (3 pieces: around sender and
# client_msg_id), seq, perm, perm epoch (2 pieces each: around the conversation)
SEND_TEMPLATES = (DEDUPE, SEQ, PERM, PERM_EPOCH)


@functools.cache
def send_key_pieces(partition: int) -> tuple[str, ...]:
    return tuple(
        piece
        for t in SEND_TEMPLATES
        for piece in (t % (partition, *("%s",) * (t.count("%s") - 1))).split("%s")
    )


def partition_of(conv_id: str, partitions: int) -> int:
    return zlib.crc32(conv_id.encode()) % partitions if partitions > 1 else 0


def boot(partition: int) -> str:
    return BOOT % partition


def seq(partition: int, conv_id: str) -> str:
    return SEQ % (partition, conv_id)


def perm(partition: int, conv_id: str) -> str:
    return PERM % (partition, conv_id)


def perm_epoch(partition: int, conv_id: str) -> str:
    return PERM_EPOCH % (partition, conv_id)


def seq_lock(partition: int, conv_id: str) -> str:
    return SEQ_LOCK % (partition, conv_id)


def dedupe(partition: int, sender_id: int, client_msg_id: str) -> str:
    return DEDUPE % (partition, sender_id, client_msg_id)


def stream(partition: int) -> str:
    return STREAM % partition


def inbox(node: str) -> str:
    return INBOX + node


def user_nodes(user_id: int) -> str:
    return USER_NODES + str(user_id)


def presence_user(user_id: int) -> str:
    return PRESENCE_USER + str(user_id)


def presence_node(node: str) -> str:
    return PRESENCE_NODE + node


def presence_devices(user_id: int) -> str:
    return PRESENCE_DEVICES + str(user_id)


def last_seen(user_id: int) -> str:
    return LAST_SEEN + str(user_id)


def user_sockets(user_id: int) -> str:
    """hash node -> the user's open sockets on that node (the cap across processes)."""
    return f"im:sk:{user_id}"


RATE_TAGS = 16  # shared rate buckets are spread over this many hash tags


def rate_tag(user_id: int) -> int:
    return user_id % RATE_TAGS


def rate_bucket(kind: str, user_id: int) -> str:
    """A user's shared rate bucket of one kind (hash t, m: ``rate_take.lua``)."""
    return f"im:rl:{{r{rate_tag(user_id)}}}:{kind}:{user_id}"


def persister_lease(partition: int) -> str:
    return PERSISTER_LEASE % partition


def login_fails_user(digest: str) -> str:
    """Failed logins of one username (``digest``: a hash of its key, so no username is
    spelled out in Redis and every key has the same short length)."""
    return f"im:lf:u:{digest}"


def login_fails_addr(addr: str) -> str:
    """Failed logins from one client address (an IPv6 client: its /64)."""
    return f"im:lf:a:{addr}"


def lookups_user(user_id: int) -> str:
    """Username lookups made by one user."""
    return f"im:lk:u:{user_id}"


def lookups_addr(addr: str) -> str:
    """Username lookups made from one client address (an IPv6 client: its /64)."""
    return f"im:lk:a:{addr}"


def registrations_addr(addr: str) -> str:
    """Accounts created from one client address (an IPv6 client: its /64)."""
    return f"im:rg:a:{addr}"


def friend_requests_user(user_id: int) -> str:
    """Friend requests sent by one user."""
    return f"im:fr:u:{user_id}"


def send_decision(sender_id: int, client_msg_id: str) -> str:
    """The before-send hook's decision on one send, kept so that a retry gets it again."""
    return f"im:bsd:{sender_id}:{client_msg_id}"
