"""The key layout lives in keys.py alone: the keys it spells (unchanged, so existing data
and the chaos tests still find them), their Cluster hash tags, and scripts that take
their keys or key templates from it instead of spelling them."""

from __future__ import annotations

import re
from pathlib import Path

from im_server.storage.redis import keys

SCRIPTS = Path(keys.__file__).parent / "scripts"


def test_the_layout() -> None:
    assert keys.seq("g:7") == "im:seq:{g:7}"
    assert keys.perm("s:1:2") == "im:perm:{s:1:2}"
    assert keys.perm_epoch("s:1:2") == "im:pe:{s:1:2}"
    assert keys.seq_lock("g:7") == "im:seqlk:{g:7}"
    assert keys.dedupe(5, "abc-1") == "im:dd:5:abc-1"
    assert keys.stream(3) == "im:stream:{p3}"
    assert keys.persister_lease(3) == "im:plk:{p3}"
    assert keys.user_channel(9) == "im:u:9"
    assert keys.presence_user(9) == "im:pu:9"
    assert keys.presence_devices(9) == "im:pd:9"


def _tag(key: str) -> str:
    m = re.search(r"\{([^}]*)\}", key)
    assert m, key
    return m.group(1)


def test_keys_of_a_conversation_share_its_hash_tag() -> None:
    conv = "g:12345"
    assert {_tag(k(conv)) for k in (keys.seq, keys.perm, keys.perm_epoch, keys.seq_lock)} == {conv}
    assert _tag(keys.stream(4)) == _tag(keys.persister_lease(4)) == "p4"


def test_the_send_scripts_key_pieces_join_into_the_python_layout() -> None:
    dd1, dd2, dd3, seq1, seq2, perm1, perm2, pe1, pe2 = keys.SEND_KEY_PIECES
    # send_batch.lua joins them with `..` around the parts, in this order
    assert dd1 + "5" + dd2 + "abc" + dd3 == keys.dedupe(5, "abc")
    assert seq1 + "g:1" + seq2 == keys.seq("g:1")
    assert perm1 + "g:1" + perm2 == keys.perm("g:1")
    assert pe1 + "g:1" + pe2 == keys.perm_epoch("g:1")
    for t in keys.SEND_TEMPLATES:  # plain %s only, so the pieces are all there is
        assert re.sub("%s", "", t).count("%") == 0


def test_scripts_spell_no_key() -> None:
    for path in SCRIPTS.glob("*.lua"):
        code = "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())
        assert not re.search(r"""['"]im:""", code), f"{path.name} spells a key itself"
