"""Decode and preprocess images off the event loop, in a bounded pool of worker threads.

PIL decoding and the image processors' resize / normalise release the GIL for most of their
work, so a few threads keep the vision tower fed while the event loop stays free.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from encoder_svc.jobs import EncodeJob, ItemFailure, Prepared
from iris.multimodal import DecodePolicy, ImageDecodeError, decode_image
from iris.multimodal.video import unpack_group


class Preprocessor:
    """Turns an `EncodeJob` into a `Prepared` item, or raises `ItemFailure` for that item.

    The image is decoded under the decode policy (the same rules the gateway counted with),
    then the runner's own preprocessing runs; the token count (and grid, when the caller
    gave one) it implies must equal what the caller expects, so a disagreement fails the
    item before any tower time is spent on it.
    """

    def __init__(self, runner, policy: DecodePolicy, workers: int) -> None:
        self._runner = runner
        self._policy = policy
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preprocess")

    async def prepare(self, job: EncodeJob) -> Prepared:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._prepare, job)

    def _prepare(self, job: EncodeJob) -> Prepared:
        if job.video:
            return self._check(job, self._prepare_group(job))
        try:
            pil = decode_image(job.image, self._policy)
        except ImageDecodeError as err:
            raise ItemFailure("decode", f"image decode failed: {err}") from None
        try:
            prepared = self._runner.preprocess(pil)
        except Exception as err:  # a processor error concerns this image alone
            raise ItemFailure("preprocess", f"image preprocessing failed: {err}") from None
        return self._check(job, prepared)

    def _prepare_group(self, job: EncodeJob):
        """A frame group: already sampled and resized by the gateway (the identity covers
        those exact frames), so only the runner's normalise and patchify run here."""
        preprocess = getattr(self._runner, "preprocess_video_group", None)
        if preprocess is None:
            raise ItemFailure("decode", "this model's encoder takes no video frame groups")
        try:
            frames = unpack_group(job.image)
        except ValueError as err:
            raise ItemFailure("decode", f"frame group unreadable: {err}") from None
        try:
            return preprocess(frames)
        except Exception as err:  # a processor error concerns this group alone
            raise ItemFailure("preprocess", f"frame group preprocessing failed: {err}") from None

    @staticmethod
    def _check(job: EncodeJob, prepared) -> Prepared:
        if prepared.token_count != job.token_count:
            raise ItemFailure(
                "token_count",
                f"image gives {prepared.token_count} vision tokens, the request expected "
                f"{job.token_count}",
            )
        if job.grid and tuple(prepared.grid) != job.grid:
            raise ItemFailure(
                "grid", f"image gives grid {tuple(prepared.grid)}, the request expected {job.grid}"
            )
        return Prepared(job, prepared)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
