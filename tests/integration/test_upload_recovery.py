"""Uploads' background work survives what goes wrong: kill -9 of the process whose worker
is making a thumbnail (the lease passes, a restarted worker makes it), and the clean-up of
uploads never sent (their objects and rows go, sent ones stay) across restarts.

These servers run on stores of their own: the suite's server would take their
thumbnail jobs, and a clean-up this quick would delete other tests' pending uploads."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from im_server.bench.cluster import Stores
from im_server.client import ApiError, Client, single_conv_id
from im_server.config import load_settings
from im_server.storage.objects import ObjectStore
from tests.support import PASSWORD, ServerProcess, befriend, eventually, new_user, persisted, pg


@pytest.fixture(scope="module")
def own_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    s = Stores.start(tmp_path_factory.mktemp("upload-stores"))
    yield s
    s.stop()


def big_png() -> bytes:
    """A 6000×5000 picture (30 Mpx) that compresses to little: slow to decode, quick to
    upload."""
    img = Image.linear_gradient("L").resize((6000, 5000)).convert("RGB")
    out = io.BytesIO()
    img.save(out, "PNG", compress_level=1)
    return out.getvalue()


async def thumb_row(stores: Stores, upload_id: str) -> tuple[str, int, int]:
    async with pg(stores) as db:
        r = await db.fetchrow(
            "SELECT thumb_state, thumb_lease_until, thumb_attempts FROM uploads WHERE upload_id = $1",
            upload_id,
        )
    assert r is not None
    return str(r[0]), int(r[1]), int(r[2])


async def test_kill9_mid_thumbnail_the_job_is_done_after_restart(own_stores: Stores) -> None:
    env = {
        **own_stores.env(),
        "IM_THUMBNAIL_LEASE_SECONDS": "2",
        "IM_THUMBNAIL_POLL_SECONDS": "0.2",
    }
    srv = ServerProcess(env=env).start()
    srv2: ServerProcess | None = None
    try:
        a = await new_user(srv.url, "ta")
        b = await new_user(srv.url, "tb")
        await befriend(a, b)
        conv = single_conv_id(a.user_id or 0, b.user_id or 0)
        up = await a.upload(big_png(), "image/png", "big.png")
        seq = (await a.send_rest(conv, {"upload_id": up}, "image"))["seq"]

        async def claimed() -> bool:
            state, lease, _ = await thumb_row(own_stores, up)
            return state == "pending" and lease > 0

        await eventually(claimed, timeout=10, interval=0.01)
        srv.kill9()
        state, _, attempts = await thumb_row(own_stores, up)
        assert (state, attempts) == ("pending", 1), "killed in the middle of the job"
        srv2 = ServerProcess(env=env).start()

        async def done() -> bool:
            return (await thumb_row(own_stores, up))[0] == "done"

        await eventually(done, timeout=60)
        b2 = await Client.login(srv2.url, b.username or "", PASSWORD)
        await persisted(b2, conv, seq, timeout=30)  # maybe still in the stream at the kill
        thumb = Image.open(io.BytesIO(await b2.download(up, thumbnail=True)))
        assert thumb.size == (320, 267)
        assert (await thumb_row(own_stores, up))[2] == 2, "made once more, by the new worker"
        await b2.aclose()
    finally:
        srv.kill9()
        if srv2 is not None:
            srv2.terminate()


async def test_unsent_uploads_are_deleted_and_sent_ones_kept(
    own_stores: Stores, tmp_path: Path
) -> None:
    env = {
        **own_stores.env(),
        "IM_UPLOAD_UNSENT_HOURS": str(2 / 3600),  # 2 s
        "IM_UPLOAD_PRUNE_SECONDS": "0.5",
    }
    srv = ServerProcess(env=env).start()
    try:
        a = await new_user(srv.url, "ca")
        b = await new_user(srv.url, "cb")
        await befriend(a, b)
        conv = single_conv_id(a.user_id or 0, b.user_id or 0)
        kept = await a.upload(b"sent", "text/plain")
        seq = (await a.send_rest(conv, {"upload_id": kept}, "file"))["seq"]
        await persisted(a, conv, seq)
        dropped = await a.upload(b"never sent", "text/plain")
        t0 = time.monotonic()

        async def gone() -> bool:
            async with pg(own_stores) as db:
                n = await db.fetchval("SELECT count(*) FROM uploads WHERE upload_id = $1", dropped)
            return n == 0

        await eventually(gone, timeout=20)
        assert time.monotonic() - t0 >= 1.5, "not before its time"
        with pytest.raises(ApiError) as e:
            await a.download(dropped)
        assert e.value.status == 404
        # its object is gone from the store too: a send naming it is refused
        with pytest.raises(ApiError):
            await a.send_rest(conv, {"upload_id": dropped}, "file")
        await asyncio.sleep(1.5)
        assert await b.download(kept) == b"sent", "a sent upload stays"
        # the sent one's client key (u/, which its presigned URL writes) goes once that
        # URL has expired: here, its seal is made to look two hours old
        settings = load_settings(**{k.removeprefix("IM_").lower(): v for k, v in env.items()})
        async with ObjectStore(settings) as objects:
            assert await objects.head(f"u/{kept}") is not None
            async with pg(own_stores) as db:
                await db.execute(
                    "UPDATE uploads SET sealed_at = sealed_at - 7200000 WHERE upload_id = $1",
                    kept,
                )

            async def raw_gone() -> bool:
                async with pg(own_stores) as db:
                    done = await db.fetchval(
                        "SELECT raw_cleared_at FROM uploads WHERE upload_id = $1", kept
                    )
                return done is not None

            await eventually(raw_gone, timeout=20)
            assert await objects.head(f"u/{kept}") is None
            assert await objects.head(f"s/{kept}") is not None
        assert await b.download(kept) == b"sent", "the sealed copy stays"
        await a.aclose()
        await b.aclose()
    finally:
        srv.terminate()
