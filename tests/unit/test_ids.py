"""Conversation ids as properties: every valid id round-trips through its builder, and any
other text is a ``bad_request`` (never another exception)."""

from __future__ import annotations

import string

from hypothesis import assume, given
from hypothesis import strategies as st

from im_server.errors import ImError
from im_server.protocol.ids import (
    MAX_ID,
    group_conv_id,
    parse_conv_id,
    single_conv_id,
    valid_client_msg_id,
)

user_ids = st.integers(min_value=1, max_value=MAX_ID)


@given(user_ids, user_ids)
def test_single_ids_round_trip(u1: int, u2: int) -> None:
    assume(u1 != u2)
    conv = single_conv_id(u1, u2)
    assert conv == single_conv_id(u2, u1)
    ref = parse_conv_id(conv)
    assert ref.kind == "single" and ref.conv_id == conv
    assert (ref.a, ref.b) == (min(u1, u2), max(u1, u2))
    assert ref.peer_of(u1) == u2 and ref.peer_of(u2) == u1
    assert ref.has_user(u1) and ref.has_user(u2)


@given(user_ids)
def test_group_ids_round_trip(g: int) -> None:
    ref = parse_conv_id(group_conv_id(g))
    assert ref.kind == "group" and ref.group_id == g and ref.conv_id == f"g:{g}"


@given(user_ids)
def test_a_chat_with_oneself_is_not_an_id(u: int) -> None:
    try:
        parse_conv_id(single_conv_id(u, u))
    except ImError as e:
        assert e.code == "bad_request"
    else:
        raise AssertionError("s:<u>:<u> was accepted")


@given(st.integers(min_value=MAX_ID + 1, max_value=10**30), user_ids)
def test_ids_above_the_bigint_range_are_refused(big: int, u: int) -> None:
    for conv in (f"g:{big}", single_conv_id(u, big)):
        try:
            parse_conv_id(conv)
        except ImError as e:
            assert e.code == "bad_request"
        else:
            raise AssertionError(f"{conv} was accepted")


@given(
    st.one_of(
        st.text(max_size=50),
        st.text(alphabet="sg:0123456789", max_size=45),
        st.from_regex(r"\A[sg]:[0-9]{1,20}(:[0-9]{1,20})?\Z"),
    )
)
def test_any_text_parses_to_its_canonical_form_or_is_a_bad_request(text: str) -> None:
    try:
        ref = parse_conv_id(text)
    except ImError as e:
        assert e.code == "bad_request" and e.status == 400
        return
    # accepted: it is exactly what the builders make of its numbers
    if ref.kind == "single":
        assert text == single_conv_id(ref.a, ref.b) and ref.a < ref.b <= MAX_ID
    else:
        assert text == group_conv_id(ref.group_id) and 1 <= ref.group_id <= MAX_ID


CMID_CHARS = set(string.ascii_letters + string.digits + "_-")


@given(st.text(max_size=70))
def test_client_msg_id_is_1_to_64_safe_characters(text: str) -> None:
    expected = 1 <= len(text) <= 64 and set(text) <= CMID_CHARS
    assert valid_client_msg_id(text) is expected
