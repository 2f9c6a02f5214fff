"""Messages or prompts → padded int64 input_ids plus the items, ready to route.

Chat: collect the image parts in order, get their bytes, describe each image, render the
chat template, tokenize, expand each placeholder to its token count, fill it with the
item's sentinels. Completions: a text or token-id prompt, which may hold no image.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gateway.errors import bad_request
from gateway.intake.images import describe_image
from gateway.intake.remote import RemoteImageFetcher
from gateway.intake.sources import image_bytes
from iris.multimodal import (
    DecodePolicy,
    MMHashesTypeError,
    MultimodalItem,
    adopt_mm_hashes,
    pad_with_offsets,
)


@dataclass
class PreparedPrompt:
    """What routing and dispatch need: padded ids, items (with offsets) and image bytes."""

    input_ids: np.ndarray  # int64, image spans hold sentinels
    items: list[MultimodalItem] = field(default_factory=list)
    images: list[bytes] = field(default_factory=list)  # the file of each item, same order

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


def split_messages(messages: Sequence[dict]) -> tuple[list[dict], list[ImageRef]]:
    """Template messages (image parts reduced to their type, URLs dropped) and the images."""
    template, images = [], []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            template.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            if part.get("type") == "image_url":
                images.append(ImageRef(part["image_url"]["url"], f"messages[{i}].content[{j}]"))
                parts.append({"type": "image_url"})
            else:
                parts.append(part)
        template.append({**message, "content": parts})
    return template, images


class PromptBuilder:
    """Builds PreparedPrompts for one model (its adapter) under the gateway's image rules."""

    def __init__(
        self,
        adapter,
        *,
        policy: DecodePolicy,
        fetcher: RemoteImageFetcher,
        max_images: int,
    ) -> None:
        self.adapter = adapter
        self.fingerprint: bytes = adapter.fingerprint
        self.policy = policy
        self.fetcher = fetcher
        self.max_images = max_images
        self.vocab_size = int(adapter.vocab_size)

    async def chat(self, messages: Sequence[dict], mm_hashes: object = None) -> PreparedPrompt:
        """A chat request's messages (plain dicts, already schema-checked) → PreparedPrompt."""
        template, refs = split_messages(messages)
        if len(refs) > self.max_images:
            raise bad_request(
                f"request has {len(refs)} images, over the limit of {self.max_images}",
                "messages",
                "too_many_images",
            )
        try:
            keys = adopt_mm_hashes(mm_hashes, len(refs))
        except MMHashesTypeError as err:
            raise bad_request(str(err), "mm_hashes") from None
        datas = await self._load(refs)
        items = [
            describe_image(
                data,
                adapter=self.adapter,
                policy=self.policy,
                fingerprint=self.fingerprint,
                caller_key=key,
                param=ref.param,
            )
            for data, key, ref in zip(datas, keys, refs, strict=True)
        ]
        try:
            prompt = self.adapter.apply_chat_template(template, add_generation_prompt=True)
        except ValueError as err:
            raise bad_request(f"cannot render the chat template: {err}", "messages") from None
        ids = self.adapter.encode_prompt(prompt)
        return self._expand(ids, items, datas, "messages")

    def text(self, prompt: str, param: str = "prompt") -> PreparedPrompt:
        """A completions text prompt (no images)."""
        return self._expand(self.adapter.encode_prompt(prompt), [], [], param)

    def tokens(self, ids: Sequence[int], param: str = "prompt") -> PreparedPrompt:
        """A completions token-id prompt; every id must be in [0, vocab_size)."""
        for index, token in enumerate(ids):
            if not 0 <= token < self.vocab_size:
                raise bad_request(
                    f"{param}[{index}] = {token} is outside the vocabulary [0, {self.vocab_size})",
                    param,
                )
        return self._expand(list(ids), [], [], param)

    async def _load(self, refs: list[ImageRef]) -> list[bytes]:
        max_bytes = self.policy.max_bytes
        # Inline images decode at once; remote ones are fetched concurrently.
        return list(
            await asyncio.gather(
                *(image_bytes(ref.url, self.fetcher, max_bytes, ref.param) for ref in refs)
            )
        )

    def _expand(
        self, ids: list[int], items: list[MultimodalItem], datas: list[bytes], param: str
    ) -> PreparedPrompt:
        try:
            expanded, spans = self.adapter.expand_prompt(ids, [item.grid for item in items])
        except ValueError as err:
            raise bad_request(f"image placeholders do not match the images: {err}", param) from None
        for item, item_spans in zip(items, spans, strict=True):
            item.offsets = [(int(start), int(end)) for start, end in item_spans]
            # The adapter's expansion and its own count must agree (its contract, not input).
            assert item.span_token_count == item.token_count, (item.offsets, item.token_count)
        padded = pad_with_offsets(expanded, items) if items else np.asarray(expanded, np.int64)
        return PreparedPrompt(padded, items, datas)
