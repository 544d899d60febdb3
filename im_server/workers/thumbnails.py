"""The thumbnail worker: takes the pending thumbnails (``uploads.thumb_state``, queued by
the first send of a picture) in leased batches, makes each in a process of its own
(``workers/decoder.py``) from the picture's sealed bytes and stores it next to them.

Driven from durable state, at least once and idempotent: a worker killed mid-job leaves
its row leased; the lease passes and any worker makes it again, writing the same object
key. A picture that is not one (or a decompression bomb) is marked ``failed`` and the
worker goes on. A store that fails gives the rows back for the next round."""

from __future__ import annotations

import logging
import time

from im_server import metrics
from im_server.context import Context
from im_server.services.thumbnails import BadImage
from im_server.services.uploads import stored_key, thumbnail_key
from im_server.storage import uploads as store
from im_server.workers.decoder import Decoder
from im_server.workers.rounds import RoundWorker

log = logging.getLogger("im_server.thumbnails")

BATCH = 8


class Thumbnailer(RoundWorker):
    name = "thumbnails"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx.thumbnails_due, log)
        self.ctx = ctx
        self.decoder = Decoder()

    def poll_seconds(self) -> float:
        return self.ctx.settings.thumbnail_poll_seconds

    async def round(self) -> bool:
        s = self.ctx.settings
        now = int(time.time() * 1000)
        async with self.ctx.db.begin() as conn:
            rows = await store.claim_thumbnails(
                conn, now, int(s.thumbnail_lease_seconds * 1000), BATCH
            )
        for up in rows:
            if self.stopping:
                break
            await self.one(up)
        return bool(rows)

    async def stop(self, timeout: float = 5.0) -> None:
        await super().stop(timeout)
        self.decoder.close()

    async def one(self, up: store.Upload) -> None:
        s = self.ctx.settings
        upload_id = up.upload_id
        state, thumb_type = "failed", None
        if up.size > s.thumbnail_source_max_bytes:
            log.info("upload %s: %d bytes, too large for a thumbnail", upload_id, up.size)
        else:
            data = await self.ctx.objects.get(stored_key(up), s.thumbnail_source_max_bytes)
            try:
                pixels = (up.width or 0) * (up.height or 0)
                thumb, thumb_type = await self.decoder.thumbnail(data, s.image_max_pixels, pixels)
            except BadImage as e:
                log.info("upload %s: no thumbnail (%s)", upload_id, e)
                thumb_type = None
            else:
                await self.ctx.objects.put(thumbnail_key(upload_id), thumb, thumb_type)
                state = "done"
        async with self.ctx.db.begin() as conn:
            await store.finish_thumbnail(conn, upload_id, state, thumb_type)
        metrics.THUMBNAILS.labels(state).inc()
