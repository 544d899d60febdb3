"""The key layout lives in keys.py alone: the keys it spells, their Cluster hash tags
(every key one script call touches lands in one slot), and scripts that take their keys
or key templates from it instead of spelling them."""

from __future__ import annotations

import re
from pathlib import Path

from redis.crc import key_slot

from im_server.storage.redis import keys

SCRIPTS = Path(keys.__file__).parent / "scripts"


def test_the_layout() -> None:
    assert keys.seq(3, "g:7") == "im:seq:{p3}:g:7"
    assert keys.perm(0, "s:1:2") == "im:perm:{p0}:s:1:2"
    assert keys.perm_epoch(0, "s:1:2") == "im:pe:{p0}:s:1:2"
    assert keys.seq_lock(3, "g:7") == "im:seqlk:{p3}:g:7"
    assert keys.dedupe(1, 5, "abc-1") == "im:dd:{p1}:5:abc-1"
    assert keys.boot(2) == "im:boot:{p2}"
    assert keys.stream(3) == "im:stream:{p3}"
    assert keys.persister_lease(3) == "im:plk:{p3}"
    assert keys.inbox("gw-1") == "im:in:gw-1"
    assert keys.user_nodes(9) == "im:loc:9"
    assert keys.presence_user(9) == "im:pu:{pr}:9"
    assert keys.presence_devices(9) == "im:pd:{pr}:9"


def test_partitions_spread_and_stay_put() -> None:
    assert keys.partition_of("g:1", 1) == 0
    convs = [f"g:{i}" for i in range(2000)]
    parts = [keys.partition_of(c, 16) for c in convs]
    assert parts == [keys.partition_of(c, 16) for c in convs]  # a pure function of the id
    counts = [parts.count(p) for p in range(16)]
    assert min(counts) > 2000 / 16 / 2, counts  # every partition takes its share


def _tag(key: str) -> str:
    m = re.search(r"\{([^}]*)\}", key)
    assert m, key
    return m.group(1)


def test_every_key_of_a_send_call_is_in_the_streams_slot() -> None:
    """A send script call touches the partition's stream and boot marker, and for every
    send in it the conversation's seq, permission and epoch keys and the dedupe key: all
    one slot, whatever the conversations, senders and client_msg_ids (on Redis Cluster a
    call over two slots fails with CROSSSLOT)."""
    partitions = 8
    for conv in ("g:1", "g:999999", "s:3:17", "s:123456789:987654321"):
        p = keys.partition_of(conv, partitions)
        slot = key_slot(keys.stream(p).encode())
        touched = [
            keys.boot(p),
            keys.seq(p, conv),
            keys.perm(p, conv),
            keys.perm_epoch(p, conv),
            keys.seq_lock(p, conv),
            keys.dedupe(p, 42, "x-{p9}-y"),  # a client_msg_id cannot move the tag
            keys.persister_lease(p),
        ]
        assert {key_slot(k.encode()) for k in touched} == {slot}, conv
        assert {_tag(k) for k in touched} == {f"p{p}"}
    # and the partitions do use different slots
    assert len({key_slot(keys.stream(p).encode()) for p in range(partitions)}) == partitions


def test_every_presence_key_is_in_one_slot() -> None:
    """One presence script call records a batch of users and the sweep walks a dead node's
    users: every key they touch shares the {pr} tag, whatever the users and nodes."""
    touched = [keys.PRESENCE_NODES, keys.PRESENCE_PENDING]
    for user in (1, 77, 123456789):
        touched += [keys.presence_user(user), keys.last_seen(user), keys.presence_devices(user)]
    touched += [keys.presence_node(n) for n in ("gw-1", "node-{x}", "")]
    assert len({key_slot(k.encode()) for k in touched}) == 1
    # and the script's pieces are the same prefixes
    assert keys.PRESENCE_PIECES[2] + "5" == keys.presence_user(5)


def test_the_send_scripts_key_pieces_join_into_the_python_layout() -> None:
    for p in (0, 5):
        dd1, dd2, dd3, seq1, seq2, perm1, perm2, pe1, pe2 = keys.send_key_pieces(p)
        # send_batch.lua joins them with `..` around the parts, in this order
        assert dd1 + "5" + dd2 + "abc" + dd3 == keys.dedupe(p, 5, "abc")
        assert seq1 + "g:1" + seq2 == keys.seq(p, "g:1")
        assert perm1 + "g:1" + perm2 == keys.perm(p, "g:1")
        assert pe1 + "g:1" + pe2 == keys.perm_epoch(p, "g:1")
    for t in keys.SEND_TEMPLATES:  # plain %s only, so the pieces are all there is
        assert re.sub("%s", "", t).count("%") == 0


def test_scripts_spell_no_key() -> None:
    for path in SCRIPTS.glob("*.lua"):
        code = "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())
        assert not re.search(r"""['"]im:""", code), f"{path.name} spells a key itself"
