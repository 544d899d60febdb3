"""Name rules (im_server.names): usernames, their comparison key, display/group names."""

from __future__ import annotations

import pytest

from im_server.names import NameRefused, check_display_name, normalize_username, username_key

# -- usernames ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        ("alice", "alice"),
        ("Alice", "Alice"),
        ("a.b-c_d", "a.b-c_d"),
        ("abc", "abc"),
        ("x" * 32, "x" * 32),
        ("张三", "张三"),  # two wide characters count four
        ("李小龙", "李小龙"),
        ("ＡＬＩＣＥ", "ALICE"),  # full width: stored in NFKC form
        ("ﬁsh", "fish"),  # ligature
        ("Ｊｏｓé", "José"),
        ("Jose\u0301", "José"),  # decomposed: composed by NFKC
        ("Ölçü", "Ölçü"),
        ("Дмитрий", "Дмитрий"),
        ("محمد", "محمد"),
        ("१२३", "१२३"),  # Devanagari digits
        ("すずき", "すずき"),
        ("김민준", "김민준"),
        ("王" * 16, "王" * 16),
        ("_\u0301x", "_\u0301x"),  # a mark on a base that is not a letter
    ],
)
def test_valid_usernames(raw: str, stored: str) -> None:
    assert normalize_username(raw) == stored


@pytest.mark.parametrize(
    "raw",
    [
        "ab",
        "x" * 33,
        "",
        "王",  # counts two
        "王" * 17,  # counts 34
        "has space",
        "slash/name",
        "at@sign",
        "emoji😀x",
        "tab\tname",
        "nul\x00name",
        "zero\u200bwidth",  # ZERO WIDTH SPACE (Cf)
        "join\u200dname",  # ZWJ: not in usernames
        "rtl\u202eeman",  # RIGHT-TO-LEFT OVERRIDE
        "lrm\u200ename",
        "alm\u061cname",
        "iso\u2066late\u2069",
        "hangul\u3164filler",
        "\u3164\u3164\u3164",
        "\u115f\u1160abc",
        "half\uffa0width",
        "braille\u2800",
        "cgj\u034fname",
        "vs\ufe0fname",
        "\u0301abc",  # starts with a combining mark
        "sur\ud800rogate",
        "x" * 300,
    ],
)
def test_refused_usernames(raw: str) -> None:
    with pytest.raises(NameRefused):
        normalize_username(raw)


@pytest.mark.parametrize("raw", [None, 12345, ["alice"], {"a": 1}, b"alice"])
def test_username_must_be_a_string(raw: object) -> None:
    with pytest.raises(NameRefused):
        normalize_username(raw)


def test_superscript_digits_normalise_to_digits() -> None:
    assert normalize_username("a²³") == "a23"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Alice", "alice"),
        ("ALICE", "alice"),
        ("ＡＬＩＣＥ", "alice"),
        ("ａｌｉｃｅ", "Alice"),
        ("Straße", "STRASSE"),
        ("José", "Jose\u0301"),
        ("ǅemal", "džemal"),
        ("ΣΊΣΥΦΟΣ", "σίσυφος"),
    ],
)
def test_username_keys_match(a: str, b: str) -> None:
    assert username_key(normalize_username(a)) == username_key(normalize_username(b))


@pytest.mark.parametrize(("a", "b"), [("alice", "alicf"), ("张三", "张山"), ("a.b", "a-b")])
def test_username_keys_differ(a: str, b: str) -> None:
    assert username_key(a) != username_key(b)


def test_username_key_is_stable() -> None:
    for name in ("Alice", "ＡＬＩＣＥ", "Straße", "ΣΊΣΥΦΟΣ", "\u0345abc", "ﬃ"):
        k = username_key(name)
        assert username_key(k) == k


# -- display and group names ------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Alice",
        "Alice Smith",
        "张三",
        "José",
        "👩\u200d💻 coder",  # ZWJ sequence
        "👨\u200d👩\u200d👧\u200d👦",
        "❤\ufe0f",  # emoji presentation
        "☺\ufe0e",  # text presentation
        "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f Scotland",
        "🇯🇵",
        "a",
        " a ",
        "葛\U000e0100",  # ideographic variation sequence
        "x" * 64,
        "محمد علي",
        "Team #1 (2026)",
    ],
)
def test_valid_display_names(name: str) -> None:
    assert check_display_name(name, "display_name") == name


@pytest.mark.parametrize(
    "name",
    [
        "a\x00b",
        "tab\tname",
        "new\nline",
        "del\x7f",
        "c1\x85",
        "line\u2028sep",
        "para\u2029sep",
        "rtl\u202eeman",
        "lre\u202aname",
        "rle\u202bname",
        "pdf\u202cname",
        "lro\u202dname",
        "lrm\u200ename",
        "rlm\u200fname",
        "alm\u061cname",
        "lri\u2066name",
        "rli\u2067name",
        "fsi\u2068name",
        "pdi\u2069name",
        "zero\u200bwidth",
        "zwnj\u200cname",
        "word\u2060joiner",
        "bom\ufeffname",
        "soft\u00adhyphen",
        "tag\U000e0041",  # a tag not after the black flag
        "🏴\U000e0067\U000e0062",  # unfinished tag sequence
        "🏴\U000e0067x\U000e007f",
        "\u3164",
        "\u3164\u3164\u3164",
        "hangul\u3164filler",
        "\u115f",
        "\u1160",
        "\uffa0",
        "\u2800",
        "\u2800\u2800",
        " ",
        "   ",
        "\u3000",  # ideographic space only
        "\u200d",
        "\ufe0f",
        "\u200d\ufe0f\u200d",
        "\u0301",  # a lone combining mark
        "sur\ud800rogate",
    ],
)
def test_refused_display_names(name: str) -> None:
    with pytest.raises(NameRefused):
        check_display_name(name, "display_name")


def test_refusal_names_the_field() -> None:
    with pytest.raises(NameRefused, match="^name "):
        check_display_name("a\u202eb", "name")
