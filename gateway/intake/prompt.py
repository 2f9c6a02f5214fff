"""Messages or prompts → padded int64 input_ids plus the items, ready to route.

Chat: collect the image parts in order, get their bytes, describe each image, render the
chat template, tokenize, expand each placeholder to its token count, fill it with the
item's sentinels. Completions: a text or token-id prompt, which may hold no image.

Rendering, tokenizing and hashing run on a worker thread (the tokenizer releases the GIL),
so a long prompt does not stall every other request on the event loop; and a text too long
to fit the context whatever its tokens is refused before it is tokenized at all.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from gateway import metrics
from gateway.errors import bad_request
from gateway.intake.budget import ImageBudget
from gateway.intake.images import describe_image
from gateway.intake.remote import RemoteImageFetcher
from gateway.intake.sources import image_bytes
from gateway.intake.video_plan import (
    VideoPlan,
    check_plans,
    decode_limits,
    decoded_bytes_bound,
    plan_video,
)
from gateway.intake.videos import (
    GroupPayload,
    ReleasedGroup,
    VideoDecoder,
    VideoGroups,
    check_group_count,
    describe_video,
    refused,
    video_bytes,
)
from gateway.tenancy import NO_SALTS, RequestSalts
from iris.multimodal import (
    DecodePolicy,
    MMHashesTypeError,
    MultimodalItem,
    check_mm_hashes_type,
    disagreeing_mm_hashes,
    pad_with_offsets,
)
from iris.multimodal.video import SampledVideo

T = TypeVar("T")


@dataclass
class PreparedPrompt:
    """What routing and dispatch need: padded ids, items (with offsets), image bytes, and
    the salts that went into the items' identities and go into the prefix's block hashes."""

    input_ids: np.ndarray  # int64, image spans hold sentinels
    items: list[MultimodalItem] = field(default_factory=list)
    images: list[bytes] = field(default_factory=list)  # the file of each item, same order
    salts: RequestSalts = NO_SALTS
    # Half-open token spans a pod never resumes inside (images whose tokens attend to each
    # other both ways, Gemma 3): the pod's block manager passes the same to the resume rule.
    uncut_spans: list[tuple[int, int]] = field(default_factory=list)

    def release_videos(self) -> None:
        """Drop this prompt's video frame groups (every choice is accepted: an encode still
        running keeps its own): the frames, and their share of the bytes in flight, go once
        nothing else holds them. A retry that must encode one of them again is a 503."""
        self.images = [
            ReleasedGroup(len(payload)) if isinstance(payload, GroupPayload) else payload
            for payload in self.images
        ]

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def image_tokens(self) -> int:
        return sum(item.token_count for item in self.items)


@dataclass(frozen=True)
class ImageRef:
    url: str
    param: str  # where the part sits in the request, for error messages
    kind: str = "image"  # or "video"


def split_messages(messages: Sequence[dict]) -> tuple[list[dict], list[ImageRef]]:
    """Template messages (image and video parts reduced to their type, URLs dropped) and
    the media parts, images and videos in the order they appear."""
    template, refs = [], []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            template.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type")
            if kind == "input_audio":
                where = f"messages[{i}].content[{j}]"
                raise bad_request(
                    f"{where}: input_audio parts are not supported (Iris serves no audio "
                    "tower; a Gemma 4 E model's is not loaded)",
                    where,
                )
            if kind in ("image_url", "video_url"):
                media = "image" if kind == "image_url" else "video"
                refs.append(ImageRef(part[kind]["url"], f"messages[{i}].content[{j}]", media))
                parts.append({"type": kind})
            else:
                parts.append(part)
        template.append({**message, "content": parts})
    return template, refs


class PromptBuilder:
    """Builds PreparedPrompts for one model (its adapter) under the gateway's image rules."""

    def __init__(
        self,
        adapter,
        *,
        policy: DecodePolicy,
        fetcher: RemoteImageFetcher,
        max_images: int,
        max_request_image_bytes: int | None = None,
        max_request_image_pixels: int | None = None,
        max_model_len: Callable[[], int] | None = None,
        videos: VideoDecoder | None = None,
        max_videos: int = 2,
    ) -> None:
        self.adapter = adapter
        self.fingerprint: bytes = adapter.fingerprint
        self.policy = policy
        self.fetcher = fetcher
        self.max_images = max_images
        self.videos = videos  # the decode pool (None: this gateway takes no video)
        self.max_videos = max_videos
        # Across all of one request's images (None: no limit beyond the per-image ones).
        self.max_request_image_bytes = max_request_image_bytes or sys.maxsize
        self.max_request_image_pixels = max_request_image_pixels or sys.maxsize
        self.vocab_size = int(adapter.vocab_size)
        self.max_model_len = max_model_len
        # No token covers more characters than its vocabulary entry has (byte-level BPE:
        # one per byte; SentencePiece: the text itself), so a text longer than the context
        # times this cannot fit.
        vocab = adapter.tokenizer().get_vocab()
        self.max_token_chars = max((len(piece) for piece in vocab), default=1)

    async def chat(
        self,
        messages: Sequence[dict],
        mm_hashes: object = None,
        salts: RequestSalts = NO_SALTS,
        tools: Sequence[dict] | None = None,
        template_kwargs: dict | None = None,
        charge: Callable[[int], None] | None = None,
    ) -> PreparedPrompt:
        """A chat request's messages (plain dicts, already schema-checked) → PreparedPrompt.

        Each image's identity is computed from its bytes under `salts.images`; a caller's
        `mm_hashes` entry that is not that identity is ignored and counted. `tools` (checked
        OpenAI tool objects) are rendered into the prompt, and `template_kwargs` (checked:
        gateway/api/reasoning.py) passed to the chat template. Videos are checked on their
        headers and `charge(tokens)` is called with their planned tokens before any frame is
        decoded (the caller's key pays for the decode before it runs)."""
        template, refs = split_messages(messages)
        image_refs = [ref for ref in refs if ref.kind == "image"]
        video_refs = [ref for ref in refs if ref.kind == "video"]
        if image_refs and not self.adapter.takes_images:
            raise bad_request(
                f"model {self.adapter.architecture} takes no images; {image_refs[0].param} is "
                "an image_url part",
                image_refs[0].param,
                "images_not_supported",
            )
        if video_refs and (not self.adapter.takes_video or self.videos is None):
            raise bad_request(
                f"model {self.adapter.architecture} takes no video; {video_refs[0].param} is "
                "a video_url part",
                video_refs[0].param,
                "videos_not_supported",
            )
        if len(video_refs) > self.max_videos:
            raise refused(
                f"request has {len(video_refs)} videos, over the limit of {self.max_videos}",
                "messages",
                "max_videos_per_request",
                "too_many_videos",
            )
        if len(image_refs) > self.max_images:
            raise bad_request(
                f"request has {len(image_refs)} images, over the limit of {self.max_images}",
                "messages",
                "too_many_images",
            )
        try:
            check_mm_hashes_type(mm_hashes)
        except MMHashesTypeError as err:
            raise bad_request(str(err), "mm_hashes") from None
        budget = ImageBudget(self.max_request_image_bytes, self.max_request_image_pixels)
        datas, video_datas = await asyncio.gather(
            self._load(image_refs, budget), self._fetch_videos(video_refs, budget)
        )
        plans = await self._plan_videos(video_refs, video_datas)
        ids, items = await asyncio.to_thread(
            self._chat,
            template,
            image_refs,
            datas,
            mm_hashes,
            salts,
            budget,
            tools,
            template_kwargs,
        )
        if not video_refs:
            return await asyncio.to_thread(self._expand, ids, items, datas, "messages", salts)
        left = self._tokens_left(ids, items, len(video_refs))
        decoded = self._decoded_bytes(plans)
        check_plans(plans, self.videos.limits, left, decoded, self.videos.memory.limit)
        if charge is not None:
            charge(sum(plan.tokens for plan in plans))
        videos = await self._decode_videos(video_datas, plans, decoded, left)
        del video_datas  # the container files: only the sampled frames are kept
        return await asyncio.to_thread(self._with_videos, ids, items, datas, videos, salts)

    def _chat(
        self,
        template,
        refs,
        datas,
        mm_hashes,
        salts: RequestSalts,
        budget: ImageBudget,
        tools,
        template_kwargs=None,
    ) -> tuple[list[int], list[MultimodalItem]]:
        """The images described and the template rendered and tokenized (videos are still
        one placeholder each)."""
        items = [
            describe_image(
                data,
                adapter=self.adapter,
                policy=self.policy,
                fingerprint=self.fingerprint,
                salt=salts.images,
                param=ref.param,
                budget=budget,
            )
            for data, ref in zip(datas, refs, strict=True)
        ]
        if mm_hashes is not None:
            # Under a salt a caller cannot know the identity; an agreeing entry is only
            # possible unsalted. Either way nothing the caller sent becomes a key.
            ignored = disagreeing_mm_hashes(mm_hashes, [item.identity for item in items])
            metrics.MM_HASHES_IGNORED.inc(len(ignored))
        self._check_length_of(template, tools)
        try:
            # Only the template emits control tokens: text is tokenized as text.
            ids = self.adapter.chat_prompt_ids(
                template, add_generation_prompt=True, tools=tools, template_kwargs=template_kwargs
            )
        except ValueError as err:
            raise bad_request(f"cannot render the chat template: {err}", "messages") from None
        except RecursionError:
            raise bad_request(
                "messages nest too deeply for the chat template to render", "messages"
            ) from None
        return ids, items

    def _tokens_left(self, ids: list[int], items: list[MultimodalItem], videos: int) -> int | None:
        """Tokens the context leaves for the videos after the text and images (each image's
        and video's placeholder is one token of `ids` before expansion)."""
        if self.max_model_len is None:
            return None
        used = len(ids) - len(items) - videos + sum(item.token_count for item in items)
        return self.max_model_len() - used

    def _with_videos(self, ids, items, datas, videos: list[SampledVideo], salts) -> PreparedPrompt:
        # Each frame group is an item, identified by its frames (gateway/intake/videos.py).
        groups = [
            describe_video(
                video, adapter=self.adapter, fingerprint=self.fingerprint, salt=salts.images
            )
            for video in videos
        ]
        return self._expand_with_videos(ids, items, datas, groups, salts)

    def _expand_with_videos(
        self,
        ids: list[int],
        items: list[MultimodalItem],
        datas: list[bytes],
        groups: list[VideoGroups],
        salts: RequestSalts,
    ) -> PreparedPrompt:
        """Images and videos expanded together; every item (image or frame group) in the
        order of its tokens, with its payload (image file or packed frame group)."""
        videos = [(video.timestamps, video.items[0].grid) for video in groups]
        try:
            expanded, image_spans, video_spans = self.adapter.expand_media(
                ids, [item.grid for item in items], videos
            )
        except ValueError as err:
            raise bad_request(
                f"image or video placeholders do not match the media: {err}", "messages"
            ) from None
        for item, spans in zip(items, image_spans, strict=True):
            item.offsets = [(int(start), int(end)) for start, end in spans]
        media = list(zip(items, datas, strict=True))
        for video, spans in zip(groups, video_spans, strict=True):
            for item, payload, (start, end) in zip(video.items, video.payloads, spans, strict=True):
                item.offsets = [(int(start), int(end))]
                media.append((item, payload))
        media.sort(key=lambda pair: pair[0].offsets[0][0])
        for item, _ in media:
            assert item.span_token_count == item.token_count, (item.offsets, item.token_count)
        ordered = [item for item, _ in media]
        padded = pad_with_offsets(expanded, ordered)
        return PreparedPrompt(padded, ordered, [payload for _, payload in media], salts)

    def _check_length_of(self, messages: Sequence[dict], tools) -> None:
        """400 for messages (and tools) whose text cannot fit the context, before the
        template renders it: the total characters of every string they hold."""
        total, stack = 0, [list(messages), tools or []]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                total += len(node)
            elif isinstance(node, dict):
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        self._check_length("", "messages", total)

    async def text(
        self, prompt: str, param: str = "prompt", salts: RequestSalts = NO_SALTS
    ) -> PreparedPrompt:
        """A completions text prompt (no images)."""
        self._check_length(prompt, param)
        ids = await asyncio.to_thread(self.adapter.encode_prompt, prompt)
        return self._expand(ids, [], [], param, salts)

    def _check_length(self, text: str, param: str, length: int | None = None) -> None:
        """400 for a text (or `length` characters) that cannot fit the context whatever it
        tokenizes to."""
        if self.max_model_len is None:
            return
        context = self.max_model_len()
        length = len(text) if length is None else length
        # x4: normalisation (NFC and the like) may merge a few characters into one.
        most = context * self.max_token_chars * 4
        if length > most:
            raise bad_request(
                f"{param} is {length} characters: more than a context of {context} tokens "
                f"can hold with this tokenizer (at most {most} characters)",
                param,
                "context_length_exceeded",
            )

    def tokens(
        self, ids: Sequence[int], param: str = "prompt", salts: RequestSalts = NO_SALTS
    ) -> PreparedPrompt:
        """A completions token-id prompt; at most the context's length, every id in
        [0, vocab_size)."""
        if self.max_model_len is not None and len(ids) >= self.max_model_len():
            context = self.max_model_len()
            raise bad_request(
                f"{param} is {len(ids)} token ids; the model's context is {context}",
                param,
                "context_length_exceeded",
            )
        if ids and max(ids) < self.vocab_size:
            return self._expand(list(ids), [], [], param, salts)
        for index, token in enumerate(ids):
            if not 0 <= token < self.vocab_size:
                raise bad_request(
                    f"{param}[{index}] = {token} is outside the vocabulary [0, {self.vocab_size})",
                    param,
                )
        return self._expand(list(ids), [], [], param, salts)

    async def _fetch_videos(self, refs: list[ImageRef], budget: ImageBudget) -> list[bytes]:
        """Each video's file, fetched or read from its data: URL (`video_max_bytes`)."""
        if not refs:
            return []
        assert self.videos is not None
        max_bytes = self.videos.limits.max_bytes
        return list(
            await asyncio.gather(
                *(video_bytes(ref.url, self.fetcher, max_bytes, ref.param, budget) for ref in refs)
            )
        )

    async def _plan_videos(self, refs: list[ImageRef], datas: list[bytes]) -> list[VideoPlan]:
        """Each video's header read in the decode pool (no frame decoded) and checked."""
        if not refs:
            return []
        assert self.videos is not None
        decoder, sampling = self.videos, self.adapter.video_sampling
        headers = await _all(
            decoder.probe(data, ref.param) for ref, data in zip(refs, datas, strict=True)
        )
        return [
            plan_video(header, ref.param, decoder.limits, sampling, self.adapter)
            for ref, header in zip(refs, headers, strict=True)
        ]

    def _decoded_bytes(self, plans: list[VideoPlan]) -> list[int]:
        """Each video's bound on its decoded frames' bytes, from its plan; a video with no
        declared duration gets at most its share of the gateway-wide bound."""
        assert self.videos is not None
        fps, limits = self.adapter.video_sampling.fps, self.videos.limits
        share = self.videos.memory.limit // self.max_videos
        return [decoded_bytes_bound(plan, limits, fps, share) for plan in plans]

    async def _decode_videos(
        self,
        datas: list[bytes],
        plans: list[VideoPlan],
        decoded: list[int],
        tokens_left: int | None,
    ) -> list[SampledVideo]:
        """The request's videos decoded in the pool once all their frames' bytes
        (`decoded`, each video's bound) are reserved together in the gateway-wide bound: a
        request never waits on its own frames. Each is decoded under its part and what the
        request's other videos leave; a 400 when their frame groups together pass
        `video_max_groups`. The first refusal cancels the other decodes."""
        assert self.videos is not None
        decoder, sampling = self.videos, self.adapter.video_sampling
        reservation = await decoder.memory.reserve(sum(decoded), "messages")

        async def one(data: bytes, plan: VideoPlan, most: int) -> SampledVideo:
            limits = decode_limits(plan, plans, decoder.limits, tokens_left, most)
            video = await decoder.decode(data, sampling, plan.param, limits)
            reservation.hold_part(video, video.decoded_bytes)
            return video

        try:
            videos = await _all(
                one(data, plan, most)
                for data, plan, most in zip(datas, plans, decoded, strict=True)
            )
        finally:
            reservation.release()  # what no video's frames took (all of it on a refusal)
        check_group_count(
            sum(video.num_groups for video in videos), decoder.limits.max_groups, "messages"
        )
        return videos

    async def _load(self, refs: list[ImageRef], budget: ImageBudget) -> list[bytes]:
        max_bytes = self.policy.max_bytes
        # Inline images decode at once; remote ones are fetched concurrently, each chunk
        # charged to the request's budget as it arrives.
        return list(
            await asyncio.gather(
                *(image_bytes(ref.url, self.fetcher, max_bytes, ref.param, budget) for ref in refs)
            )
        )

    def _expand(
        self,
        ids: list[int],
        items: list[MultimodalItem],
        datas: list[bytes],
        param: str,
        salts: RequestSalts,
    ) -> PreparedPrompt:
        if not ids:
            raise bad_request(f"{param} is empty: it has no tokens", param)
        try:
            expanded, spans = self.adapter.expand_prompt(ids, [item.grid for item in items])
        except ValueError as err:
            raise bad_request(f"image placeholders do not match the images: {err}", param) from None
        for item, item_spans in zip(items, spans, strict=True):
            item.offsets = [(int(start), int(end)) for start, end in item_spans]
            # The adapter's expansion and its own count must agree (its contract, not input).
            assert item.span_token_count == item.token_count, (item.offsets, item.token_count)
        padded = pad_with_offsets(expanded, items) if items else np.asarray(expanded, np.int64)
        uncut = []
        if self.adapter.bidirectional_image_spans:
            uncut = [(start, end + 1) for item in items for start, end in item.offsets]
        return PreparedPrompt(padded, items, datas, salts, uncut)


async def _all(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Each awaitable's result, in order; the first to fail cancels the others (a refused
    video's sibling stops decoding, its frames and reservation released) and is raised."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_awaited(each)) for each in awaitables]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
