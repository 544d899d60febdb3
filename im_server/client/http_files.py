"""Pictures and files, and push registrations: the REST calls of
:class:`~im_server.client.http.Client` that move bytes or name devices."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from im_server.client.errors import ApiError
from im_server.client.http_base import ClientBase
from im_server.client.wire import JsonObject

UPLOAD_CHUNK = 256 * 1024  # bytes read and sent at a time by upload_file


class FilesApi(ClientBase):
    async def register_push(
        self, app_id: str, pushkey: str, platform: str, data: dict[str, Any] | None = None
    ) -> None:
        """Tie a push registration to this session (replacing its registration); ``data``
        for Web Push: the subscription's ``{endpoint, auth}``."""
        body: dict[str, Any] = {"app_id": app_id, "pushkey": pushkey, "platform": platform}
        if data is not None:
            body["data"] = data
        await self.request("PUT", "/v1/push/registration", json=body)

    async def push_config(self) -> dict[str, Any]:
        """What a browser needs to subscribe to Web Push ({} when not configured)."""
        return dict(await self.request("GET", "/v1/push/config"))

    async def unregister_push(self) -> None:
        """Remove this session's push registration (204 when it had none)."""
        await self.request("DELETE", "/v1/push/registration")

    # -- uploads -----------------------------------------------------------------------
    async def upload(self, data: bytes, content_type: str, filename: str | None = None) -> str:
        """Upload bytes for a picture or file message: ask for a presigned PUT, send the
        bytes straight to the object store, return the ``upload_id`` to send."""
        ticket = await self._ticket(content_type, len(data), filename)
        await self._put(ticket, data)
        return str(ticket["upload_id"])

    async def upload_file(
        self,
        path: str | os.PathLike[str],
        content_type: str,
        filename: str | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> str:
        """:meth:`upload` of a file on disk, streamed in chunks (a large file is never
        held in memory). The server is asked first, with the file's size, so one over
        the limit is refused (``too_large``) before a byte is read. ``on_progress(sent,
        total)`` after each chunk."""
        size = os.stat(path).st_size
        ticket = await self._ticket(content_type, size, filename or os.path.basename(path))

        async def chunks() -> AsyncIterator[bytes]:
            sent = 0
            with open(path, "rb") as f:  # noqa: ASYNC230 - chunks of 256 KiB from a local disk
                while sent < size and (chunk := f.read(min(UPLOAD_CHUNK, size - sent))):
                    sent += len(chunk)
                    yield chunk
                    if on_progress is not None:
                        on_progress(sent, size)
            if sent != size:
                raise OSError(f"{path} changed while it was uploaded")

        # the length is known: a presigned PUT takes no chunked transfer encoding
        await self._put(ticket, chunks(), {"Content-Length": str(size)})
        return str(ticket["upload_id"])

    async def _ticket(self, content_type: str, size: int, filename: str | None) -> JsonObject:
        body: dict[str, Any] = {"content_type": content_type, "size": size}
        if filename is not None:
            body["filename"] = filename
        return await self._obj("POST", "/v1/uploads", json=body)

    async def _put(
        self,
        ticket: JsonObject,
        content: bytes | AsyncIterator[bytes],
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """The bytes to the presigned URL, with exactly the headers it was signed with."""
        resp = await self.http.request(
            str(ticket["method"]),
            str(ticket["url"]),
            content=content,
            headers={**dict(ticket["headers"]), **(extra or {})},
        )
        if resp.status_code >= 300:
            raise ApiError(
                resp.status_code, "upload_failed", f"the object store answered {resp.status_code}"
            )

    async def download(self, upload_id: str, thumbnail: bool = False) -> bytes:
        """The bytes of an upload I may see (its thumbnail with ``thumbnail``), through the
        server's redirect to a presigned URL."""
        path = f"/v1/uploads/{upload_id}" + ("/thumbnail" if thumbnail else "")
        resp = await self.http.get(
            self.base_url + path, headers=self.auth_headers(), follow_redirects=True
        )
        if resp.status_code >= 300:
            raise ApiError.from_response(resp.status_code, resp.content)
        return resp.content

    async def push_registrations(self) -> list[JsonObject]:
        """Mine: ``[{app_id, pushkey, platform, device_id}]``."""
        return await self._list("GET", "/v1/push/registrations")
