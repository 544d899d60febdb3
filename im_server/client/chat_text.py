"""What the terminal chat (``chat.py``) prints and parses, as plain functions: message
bodies and attachments as one line, snippets, sizes, times, mentions typed as
``@<id>``, paths of files to send and to save."""

from __future__ import annotations

import io
import re
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

NO_CONV = "open a conversation first: /open <conv_id|user_id>"

# "@42" and "@all" as words of their own: not inside an address (a@42) nor "@allison"
MENTION = re.compile(r"(?<![\w@])@(all|[0-9]{1,19})(?![\w@])")

SNIPPET_CHARS = 60

#: Types only the server makes; they quote as their type, never as text.
NOTICE_TYPES = frozenset({"system", "recall", "edit", "reaction"})

#: Pictures and files: the content names an upload (PROTOCOL.md, "Attachments").
ATTACHMENTS = frozenset({"image", "file"})
#: What the server takes as a picture; another file goes as a file.
PICTURE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})

#: The settings commands: the field each sets, and its value.
SETTINGS: dict[str, tuple[str, bool]] = {
    "/mute": ("muted", True),
    "/unmute": ("muted", False),
    "/pin": ("pinned", True),
    "/unpin": ("pinned", False),
}

Show = Callable[[], Awaitable[None]]


def parse_mentions(text: str) -> tuple[list[int], bool]:
    """The user ids named by ``@<user_id>`` words (each once, in order) and whether
    ``@all`` is there. The text itself is sent unchanged."""
    ids: list[int] = []
    everyone = False
    for m in MENTION.finditer(text):
        if m.group(1) == "all":
            everyone = True
        elif int(m.group(1)) not in ids:
            ids.append(int(m.group(1)))
    return ids, everyone


def body(m: Mapping[str, Any]) -> str:
    """What a message says, as one string: its text, a picture's or file's description,
    or its type for other content."""
    if m.get("recalled"):
        return "(recalled)"
    content = m.get("content")
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return str(content["text"])
    if m.get("content_type") in ATTACHMENTS and isinstance(content, dict):
        return attachment(str(m["content_type"]), content)
    return f"({m.get('content_type', 'message')})"


def attachment(kind: str, c: Mapping[str, Any]) -> str:
    """``[picture name, 800×600, 1.2 MB] caption``: what an image or file message holds."""
    parts = [str(c.get("name") or "unnamed")]
    if isinstance(c.get("width"), int) and isinstance(c.get("height"), int):
        parts.append(f"{c['width']}×{c['height']}")
    if isinstance(c.get("size"), int):
        parts.append(human_size(c["size"]))
    label = "[" + ("picture " if kind == "image" else "file ") + ", ".join(parts) + "]"
    caption = c.get("caption")
    return f"{label} {caption}" if isinstance(caption, str) and caption else label


def human_size(n: int) -> str:
    """Bytes as people read them: ``512 B``, ``1.5 KB``, ``3.2 MB`` (powers of 1,000)."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def free_path(folder: Path, name: str) -> Path:
    """Where to save ``name`` in ``folder`` without replacing a file there: the name as
    the server gave it (no folders in it), else ``stem (1).ext``, ``stem (2).ext``..."""
    safe = Path(name.replace("\\", "/")).name or "download"
    if safe in (".", ".."):
        safe = "download"
    target = folder / safe
    stem, suffix = Path(safe).stem, Path(safe).suffix
    n = 1
    while target.exists():
        target = folder / f"{stem} ({n}){suffix}"
        n += 1
    return target


def local_file(path: str) -> tuple[Path, int] | None:
    """The file ``path`` names (``~`` expanded) and its size; None when it is none."""
    file = Path(path).expanduser()
    return (file, file.stat().st_size) if file.is_file() else None


def save_new(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` as a new file in ``folder`` (made if missing); where it went."""
    folder = folder.expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        target = free_path(folder, name)
        try:
            with target.open("xb") as f:  # never over a file that appeared meanwhile
                f.write(data)
            return target
        except FileExistsError:
            continue


def split_path(rest: str) -> tuple[str, str]:
    """``/file``'s arguments: a path (shell quoting for spaces) and the caption after it,
    as typed. ``ValueError`` when there is no path."""
    buf = io.StringIO(rest)
    lex = shlex.shlex(buf, posix=True)
    lex.whitespace_split = True
    path = lex.get_token()
    if not path:
        raise ValueError("a path is needed")
    return path, buf.read().strip()


def snippet(text: str) -> str:
    """One line of at most SNIPPET_CHARS characters, for a quote."""
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"


def list_line(state: Mapping[str, Any], label: str) -> str:
    """One conversation of /list (markup-safe): ``@`` while mentions of me are unread,
    then id, name, unread count, and the ``pinned`` / ``muted`` marks."""
    mark = "@" if state.get("mention_unread") else " "
    flags = "".join(f" [bold]{word}[/]" for word in ("pinned", "muted") if state.get(word))
    name = escape(f"{label:<20}")  # padded first: an escape adds a character
    return f"{mark} {escape(state['conv_id']):<22} {name} unread {state['unread']}{flags}"


def clock(ms: int) -> str:
    """A server time (ms) as local time: ``HH:MM`` today, with the date otherwise."""
    t = time.localtime(ms / 1000)
    if time.strftime("%Y-%m-%d", t) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M", t)
    return time.strftime("%Y-%m-%d %H:%M", t)


HELP = """commands:
  /me                      who am I (give your user id to friends)
  /add <user_id>           send a friend request (accepts theirs if they asked first)
  /requests                pending friend requests
  /accept <request_id>     accept a request
  /friends                 your friends
  /online                  which friends are online, or when they were last seen
  /list                    your conversations, pinned first, with unread counts and the
                           badge (@: you were mentioned)
  /open <conv_id|user_id>  chat in a conversation (a user id opens your single chat)
  /bot <user_id>           open a chat with a bot (no friend request needed)
  /history [n]             the last n messages of the open conversation (default 20)
  /group <name> <ids...>   create a group with these members
  /reply <seq> <text>      reply to message <seq> of the open conversation
  /edit <seq> <text>       change the text of your message
  /react <seq> <emoji>     react to a message (/unreact <seq> <emoji> takes it back)
  /recall <seq>            recall your message
  /file <path> [caption]   send a file (a picture shows as one); quote a path with spaces
  /save <seq> [folder]     save the picture or file of message <seq> (default: here)
  /mute, /unmute           mute the open conversation (only mentions count toward the badge)
  /pin, /unpin             keep the open conversation at the top of /list
  /quit                    leave
anything else is sent to the open conversation; in a group, @<user_id> mentions a
member and @all everyone (owners and admins only)"""


def upload_bar(console: Console) -> Progress:
    """The progress bar of ``/file`` (a pipe gets the outcome, not the bar)."""
    return Progress(
        "[dim]{task.description}[/]",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
