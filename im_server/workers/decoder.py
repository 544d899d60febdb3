"""Pictures are decoded in a child process, never in the server.

Why: a 300 KB PNG of 40 megapixels decodes to ~120 MB of pixels (more while resizing),
and an allocator seldom gives such memory back: decoded in the server, it stayed with
the server (190 MB became 590 MB for good). In a child, it is the child's: the child
decodes pictures one after the other and is ended after any picture of more than
``RECYCLE_PIXELS``, taking that memory with it (the next picture starts a new child,
from a fork server that has the decoding module loaded). A child that dies (out of
memory, a decoder crash) fails that picture only."""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from im_server.services.thumbnails import BadImage, make_thumbnail

_PRELOAD = ["im_server.services.thumbnails"]
RECYCLE_PIXELS = 4_000_000  # a picture larger than this ends its child


class Decoder:
    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            mp = multiprocessing.get_context("forkserver")
            mp.set_forkserver_preload(_PRELOAD)
            self._pool = ProcessPoolExecutor(1, mp_context=mp)
        return self._pool

    async def thumbnail(self, data: bytes, max_pixels: int, pixels: int) -> tuple[bytes, str]:
        """``make_thumbnail`` in the child; ``BadImage`` for what it refuses, and for a
        child that died on the picture. ``pixels``: the picture's size as its header
        declared it at the send (the child is ended after a large one)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor(), make_thumbnail, data, max_pixels)
        except BrokenProcessPool:
            self.close()
            raise BadImage("the decoding process died on this picture") from None
        finally:
            if pixels > RECYCLE_PIXELS:
                self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
