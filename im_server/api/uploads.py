"""Uploads: pictures and files go to the object store through presigned URLs; this
router only signs, checks and redirects."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from im_server.api.deps import ERRORS, Ctx, CurrentUser
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import DownloadLink, UploadTicket
from im_server.api.schemas import UploadBody
from im_server.services import uploads

router = APIRouter(
    prefix="/v1/uploads", tags=["uploads"], responses=ERRORS, route_class=StrictJsonRoute
)


@router.post(
    "",
    status_code=201,
    summary="Ask to upload: a presigned PUT for the bytes",
    description=(
        "PUT the bytes to `url` with `method` and exactly `headers`, before `expires_at`; "
        "then send a message `content_type: image|file`, `content: {upload_id, caption?}`."
    ),
    responses={413: {"description": "too_large: size above the limit"}},
)
async def create_upload(body: UploadBody, caller: CurrentUser, ctx: Ctx) -> UploadTicket:
    t = await uploads.do_create(ctx, caller.user_id, body.content_type, body.size, body.filename)
    return UploadTicket(
        upload_id=t.upload_id, url=t.url, method="PUT", headers=t.headers, expires_at=t.expires_at
    )


async def _fetch(
    ctx: Ctx, user_id: int, upload_id: str, thumbnail: bool, redirect: bool
) -> Response:
    url = await uploads.do_fetch(ctx, user_id, upload_id, thumbnail)
    expires = ctx.settings.download_url_seconds
    if not redirect:
        link = DownloadLink(url=url, expires_at=int(time.time() * 1000) + expires * 1000)
        return Response(link.model_dump_json(), media_type="application/json")
    # the URL is signed for this user's request: caches may keep it, privately, a while
    cache = f"private, max-age={max(0, expires - 60)}"
    return RedirectResponse(url, status_code=302, headers={"Cache-Control": cache})


_FETCH_DOC = (
    "302 to a short-lived presigned download URL, for the uploader and for every user who "
    "can see a message carrying the upload (in their window, not recalled); 404 for anyone "
    "else. `?redirect=false` answers `{url, expires_at}` instead (for a page that shows the "
    "picture in an `<img>`, which cannot send a token)."
)


@router.get(
    "/{upload_id}",
    summary="Download an upload",
    description=_FETCH_DOC,
    response_model=DownloadLink,
    responses={302: {"description": "to the presigned URL"}},
)
async def get_upload(
    upload_id: str, caller: CurrentUser, ctx: Ctx, redirect: bool = True
) -> Response:
    return await _fetch(ctx, caller.user_id, upload_id, False, redirect)


@router.get(
    "/{upload_id}/thumbnail",
    summary="Download a picture's thumbnail (JPEG or PNG, at most 320 px)",
    description=_FETCH_DOC + " 404 also while the thumbnail is not made yet.",
    response_model=DownloadLink,
    responses={302: {"description": "to the presigned URL"}},
)
async def get_thumbnail(
    upload_id: str, caller: CurrentUser, ctx: Ctx, redirect: bool = True
) -> Response:
    return await _fetch(ctx, caller.user_id, upload_id, True, redirect)
