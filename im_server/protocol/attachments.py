"""The wire rules of pictures and files: what a client sends (``content: {upload_id,
caption?}`` under ``content_type`` ``image`` or ``file``), what the server stores and
delivers instead (:class:`AttachmentContent`), and the bounds of an upload's declared
type, size and name.

The bytes never pass through the server: a client asks for an upload (``POST
/v1/uploads``), puts the bytes to the presigned URL it gets, then sends a message that
names the upload. The server checks the object (owner, presence, size) and writes the
content from what it knows, so a client cannot claim a size, type or name it did not
upload."""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Final, NotRequired

from pydantic import ConfigDict, JsonValue, StringConstraints, with_config
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from im_server.protocol.types import Rule

ATTACHMENT_TYPES: Final = frozenset({"image", "file"})
CAPTION_MAX = 4096  # characters
FILENAME_MAX = 255  # characters

UPLOAD_ID_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"
_UPLOAD_ID = re.compile(UPLOAD_ID_PATTERN)
UploadId = Annotated[
    str,
    StringConstraints(pattern=UPLOAD_ID_PATTERN),
    Rule("must be an upload_id as POST /v1/uploads answered it"),
]

MIME_PATTERN = r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}$"
MimeType = Annotated[
    str,
    StringConstraints(pattern=MIME_PATTERN),
    Rule("must be a lowercase media type like 'image/jpeg', without parameters"),
]

UPLOAD_RULE = "an image or file message needs content.upload_id (one of my uploads)"
CAPTION_RULE = f"content.caption must be a string of at most {CAPTION_MAX} characters"


def valid_upload_id(value: str) -> bool:
    return bool(_UPLOAD_ID.match(value))


def check_attachment_content(content_type: str, content: dict[str, JsonValue]) -> None:
    """A picture or file message names one of my uploads, and may have a caption."""
    if content_type not in ATTACHMENT_TYPES:
        return
    upload_id = content.get("upload_id")
    if not isinstance(upload_id, str) or not valid_upload_id(upload_id):
        raise PydanticCustomError("bad_value", UPLOAD_RULE)
    caption = content.get("caption")
    if caption is not None and (not isinstance(caption, str) or len(caption) > CAPTION_MAX):
        raise PydanticCustomError("bad_value", CAPTION_RULE)


def clean_filename(name: str) -> str:
    """A file name as stored and offered for download: no folders, no control or format
    characters, at most ``FILENAME_MAX`` characters. ``ValueError`` when nothing is left."""
    name = unicodedata.normalize("NFC", name).replace("\\", "/").rsplit("/", 1)[-1].strip()
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C")
    if not name or name in (".", ".."):
        raise ValueError("filename must name a file (not empty, no folder)")
    if len(name) > FILENAME_MAX:
        raise ValueError(f"filename is longer than {FILENAME_MAX} characters")
    return name


@with_config(ConfigDict(extra="forbid"))
class AttachmentContent(TypedDict):
    """The content the server stores for an ``image`` or ``file`` message."""

    upload_id: str
    name: str
    size: int
    mime: str
    caption: NotRequired[str]
    width: NotRequired[int]
    height: NotRequired[int]


def attachment_content(
    upload_id: str,
    name: str,
    size: int,
    mime: str,
    caption: str | None,
    width: int | None = None,
    height: int | None = None,
) -> AttachmentContent:
    c: AttachmentContent = {"upload_id": upload_id, "name": name, "size": size, "mime": mime}
    if caption is not None:
        c["caption"] = caption
    if width is not None and height is not None:
        c["width"] = width
        c["height"] = height
    return c
