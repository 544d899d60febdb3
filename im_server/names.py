"""The rules for names people see: usernames, display names, group names.

Two names that look alike must not pass for different accounts, and a name must not
hide text or reorder what is shown around it. So:

* a username is stored in NFKC form and compared by its *key* (NFKC, case folded,
  NFKC again): ``Alice``, ``alice`` and the full-width ``ＡＬＩＣＥ`` are one account;
* a username holds Unicode letters, combining marks and decimal digits plus ``_ . -``
  (``张三`` is a username), never an invisible character;
* a display or group name may hold almost anything visible (emoji sequences included),
  but no control character, no bidi control, no invisible format character and no
  blank "letter", and at least one visible character.

Pure functions: no I/O, no settings. A rule broken raises :class:`NameRefused`, a
``bad_request`` whose message names the rule.
"""

from __future__ import annotations

import unicodedata

from im_server.errors import ImError

USERNAME_MIN = 3
USERNAME_MAX = 32
USERNAME_RAW_MAX = 256  # longer input is refused before it is normalised at all

ZWJ = "\u200d"  # ZERO WIDTH JOINER: joins emoji into one (family, profession, flags)
EMOJI_VARIATION = {"\ufe0e", "\ufe0f"}  # text / emoji presentation
BLACK_FLAG = "\U0001f3f4"  # the base of the subdivision flags' tag sequences
TAG_END = "\U000e007f"  # CANCEL TAG, closes a tag sequence

# shown as nothing, yet not spaces: they make a name look blank or like another name
BLANKS = frozenset(
    {
        "\u034f",  # COMBINING GRAPHEME JOINER
        "\u115f",  # HANGUL CHOSEONG FILLER
        "\u1160",  # HANGUL JUNGSEONG FILLER
        "\u17b4",  # KHMER VOWEL INHERENT AQ
        "\u17b5",  # KHMER VOWEL INHERENT AA
        "\u2800",  # BRAILLE PATTERN BLANK
        "\u3164",  # HANGUL FILLER
        "\uffa0",  # HALFWIDTH HANGUL FILLER
    }
)

# bidi controls: they reorder the text around them (all of category Cf, listed so the
# rule stays explicit whatever the Unicode version says)
BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


class NameRefused(ImError):
    """A name breaks one of the rules (``bad_request``); the message says which."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_request", message)


def _is_variation_selector(ch: str) -> bool:
    cp = ord(ch)
    return 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF or 0x180B <= cp <= 0x180D


def _width(ch: str) -> int:
    """Columns a character takes: wide and full-width characters (CJK) count two."""
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


# ---- usernames ----------------------------------------------------------------------------


def username_key(username: str) -> str:
    """What two usernames are compared by: NFKC, case folded, NFKC again (case folding
    can undo a normalisation, e.g. U+0345 folds to U+03B9)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", username).casefold())


def _username_char_ok(ch: str) -> bool:
    if ch in "_.-":
        return True
    if ch in BLANKS or _is_variation_selector(ch):
        return False
    cat = unicodedata.category(ch)
    return cat[0] in "LM" or cat == "Nd"


def normalize_username(raw: object) -> str:
    """The username as stored: NFKC of what was given, or :class:`NameRefused`.

    3–32 characters after NFKC, where a wide (CJK) character counts as two, so ASCII
    names keep their old 3–32 bounds and a two-character Chinese name fits."""
    if not isinstance(raw, str):
        raise NameRefused("username must be a string")
    if len(raw) > USERNAME_RAW_MAX:
        raise NameRefused(f"username: at most {USERNAME_MAX} characters")
    name = unicodedata.normalize("NFKC", raw)
    if not all(_username_char_ok(ch) for ch in name):
        raise NameRefused("username: letters, marks, digits, '_', '.', '-' only")
    if name and unicodedata.category(name[0])[0] == "M":
        raise NameRefused("username must not start with a combining mark")
    size = sum(_width(ch) for ch in name)
    if not USERNAME_MIN <= size <= USERNAME_MAX:
        raise NameRefused(
            f"username: {USERNAME_MIN}-{USERNAME_MAX} characters (a wide character counts as two)"
        )
    return name


# ---- display and group names ---------------------------------------------------------------


def _visible(ch: str) -> bool:
    if ch in BLANKS:
        return False
    return unicodedata.category(ch)[0] in "LNPS"


def check_display_name(value: str, field: str) -> str:
    """``value`` if it is fit to show as a name, else :class:`NameRefused`.

    Refused: control characters, lone surrogates, line and paragraph separators, bidi
    controls, invisible format characters (category Cf) and blank letters, and a name
    with no visible character. Allowed among the invisible ones, because emoji need
    them: ZERO WIDTH JOINER, variation selectors, and the tag characters of a flag's
    tag sequence (U+1F3F4, tags, CANCEL TAG)."""
    in_tags = False
    visible = False
    for i, ch in enumerate(value):
        cat = unicodedata.category(ch)
        if in_tags:
            if ch == TAG_END:
                in_tags = False
                continue
            if 0xE0020 <= ord(ch) <= 0xE007E:
                continue
            raise NameRefused(f"{field}: an unfinished emoji tag sequence")
        if cat == "Cc":
            raise NameRefused(f"{field} must not contain control characters")
        if cat == "Cs":
            raise NameRefused(f"{field} is not valid Unicode")
        if cat in ("Zl", "Zp"):
            raise NameRefused(f"{field} must not contain line breaks")
        if ch in BIDI_CONTROLS:
            raise NameRefused(f"{field} must not contain bidi control characters")
        if ch in BLANKS:
            raise NameRefused(f"{field} must not contain blank filler characters")
        if cat == "Cf":
            if ch == ZWJ:
                continue
            if 0xE0020 <= ord(ch) <= 0xE007E and i > 0 and value[i - 1] == BLACK_FLAG:
                in_tags = True
                continue
            raise NameRefused(f"{field} must not contain invisible format characters")
        if ch in EMOJI_VARIATION or _is_variation_selector(ch):
            continue
        visible = visible or _visible(ch)
    if in_tags:
        raise NameRefused(f"{field}: an unfinished emoji tag sequence")
    if not visible:
        raise NameRefused(f"{field} must contain a visible character")
    return value
