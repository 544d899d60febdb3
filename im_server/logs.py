"""Logging setup: plain text by default, one JSON object per line with IM_LOG_FORMAT=json.

Every line goes through :func:`redact` in the handler's formatter, whichever logger wrote
it (ours, uvicorn's, the store drivers') and tracebacks included: a WebSocket token sits in
the query string that uvicorn logs for each upgrade, and a store URL may carry a password.
Uncaught exceptions and warnings are routed through the same handler, so they are
redacted too."""

from __future__ import annotations

import logging
import re
import sys
import threading
from types import TracebackType
from urllib.parse import unquote_plus

import orjson

MASK = "***"


_KEYS = "password|passwd|secret_access_key|secret_key|secret|token|authorization|api_key"

# (lower-case substrings without which the pattern cannot match, pattern). Group ``s`` of
# a match is the secret. Patterns are written in lower case and run on the lower-cased
# line, where a literal prefix makes the regex engine skip ahead quickly; each starts at a
# literal and scans forward from it, so the cost stays linear in the length of the line
# however long its words are.
_RULES_SRC: tuple[tuple[tuple[str, ...], str], ...] = (
    # "password": "x", 'token': 'x', secret='x' (JSON, dict and keyword reprs)
    (
        ("passw", "secret", "token", "authoriz", "api_key"),
        rf"""(?:{_KEYS})["']?\s*[:=]\s*(["'])(?P<s>(?:\\.|(?!\1)[^\\\n])*)\1""",
    ),
    # Authorization: <scheme> x (headers as logged by the HTTP and WebSocket libraries)
    (("authoriz",), r"""authorization["']?\s*[:=]\s*["']?(?:[a-z]+[ \t]+)?(?P<s>[^\s"',;]+)"""),
    # token=x / password=x in a query string or a key=value DSN; the signature of a
    # presigned S3 URL (it grants access until it expires)
    (
        ("token=", "password=", "passwd=", "secret", "api_key=", "signature="),
        r"""(?:token|password|passwd|secret_key|secret|api_key|x-amz-signature)=(?P<s>[^&\s"'#<>;,]+)""",
    ),
    # Bearer x anywhere else
    (("bearer",), r"""bearer\s+(?P<s>[^\s"',;]+)"""),
    # scheme://user:password@host (store URLs): the password runs to the last @ before
    # the path
    (("://",), r"://[^\s:/?#@]*:(?P<s>[^\s/?#]*)@"),
    # password hashes
    (("$argon2",), r"\$argon2(?:id|i|d)\$(?P<s>[a-z0-9+/=,$.]+)"),
    # an API key of the app's servers, wherever it shows (an X-Api-Key header as a
    # library logs it, a key pasted in the wrong place)
    (("imk_",), r"imk_(?P<s>[a-z0-9_-]{8,})"),
    # a JWT (an app-signed token) anywhere: its header, payload and signature
    (("eyj",), r"eyj[a-z0-9_-]+\.(?P<s>[a-z0-9_-]+\.[a-z0-9_-]*)"),
)
# the same patterns on the original text, for the rare line whose lower-case form has
# another length (then positions in it do not map back)
_RULES = tuple(
    (cands, re.compile(src), re.compile(src, re.IGNORECASE)) for cands, src in _RULES_SRC
)


# a query parameter whose name is spelled with escapes (``%74oken=``, ``tok%65n=``,
# ``+``): the name is decoded as the server decodes it (``urllib.parse`` percent-decoding,
# ``+`` as a space) and its value masked when that names a secret
_ESCAPED_PARAM = re.compile(
    r"""(?:^|[?&;\s"'])(?P<n>[^=&\s?#;"'<>]*(?:%[0-9a-fA-F]{2}|\+)[^=&\s?#;"'<>]*)=(?P<s>[^&\s"'#<>;,]*)"""
)
_SECRET_NAMES = frozenset(_KEYS.split("|")) | {"passwd", "x-amz-signature"}


def _escaped_params(text: str, spans: list[tuple[int, int]]) -> None:
    for m in _ESCAPED_PARAM.finditer(text):
        name = unquote_plus(m.group("n")).strip().lower()
        if name in _SECRET_NAMES and m.end("s") > m.start("s"):
            spans.append(m.span("s"))


def redact(text: str) -> str:
    """``text`` with tokens, bearer credentials, URL passwords, password fields and
    password hashes replaced by ``***``; a query parameter counts by its decoded name."""
    low = text.lower()
    same = len(low) == len(text)
    spans: list[tuple[int, int]] = []
    if "%" in text or "+" in text:
        _escaped_params(text, spans)
    for cands, on_lower, on_text in _RULES:
        for cand in cands:
            if cand in low:
                for m in on_lower.finditer(low) if same else on_text.finditer(text):
                    if m.end("s") > m.start("s"):
                        spans.append(m.span("s"))
                break
    if not spans:
        return text
    spans.sort()
    out: list[str] = []
    pos = 0
    for start, end in spans:
        if end <= pos:
            continue
        out.append(text[pos : max(start, pos)])
        out.append(MASK)
        pos = end
    out.append(text[pos:])
    return "".join(out)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            out["stack"] = redact(self.formatStack(record.stack_info))
        return orjson.dumps(out).decode()


def _log_uncaught(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    logging.getLogger("im_server").critical("uncaught exception", exc_info=(exc_type, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    name = args.thread.name if args.thread else "?"
    logging.getLogger("im_server").critical(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def setup(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
