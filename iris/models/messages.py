"""OpenAI-style chat messages -> the structured form HF chat templates expect.

An OpenAI message's content is a string or a list of parts; text parts stay text, image
parts (`image_url`, `input_image`, `image`) become `{"type": "image"}` and video parts
(`video_url`, `video`) `{"type": "video"}`, so the template renders the family's image or
video placeholder. Pixels and frames are handled elsewhere (the gateway).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})
VIDEO_PART_TYPES = frozenset({"video_url", "video"})
TEXT_PART_TYPES = frozenset({"text", "input_text"})


def _part(part: Any, where: str) -> dict:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, dict) or "type" not in part:
        raise ValueError(f"{where}: a content part must be an object with a 'type', got {part!r}")
    kind = part["type"]
    if kind in IMAGE_PART_TYPES:
        return {"type": "image"}
    if kind in VIDEO_PART_TYPES:
        return {"type": "video"}
    if kind in TEXT_PART_TYPES:
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{where}: text part needs a string 'text', got {text!r}")
        return {"type": "text", "text": text}
    supported = ", ".join(sorted(IMAGE_PART_TYPES | VIDEO_PART_TYPES | TEXT_PART_TYPES))
    raise ValueError(f"{where}: unsupported content part type {kind!r} (supported: {supported})")


def to_template_messages(messages: Sequence[dict]) -> tuple[list[dict], int]:
    """Normalise messages for a chat template; returns them and the number of images."""
    normalised = []
    images = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"messages[{index}] must be an object with a 'role'")
        content = message.get("content")
        if content is None or isinstance(content, str):
            normalised.append({**message, "content": content or ""})
            continue
        if not isinstance(content, list):
            raise ValueError(f"messages[{index}].content must be a string or a list of parts")
        parts = [_part(part, f"messages[{index}].content[{j}]") for j, part in enumerate(content)]
        images += sum(part["type"] == "image" for part in parts)
        normalised.append({**message, "content": parts})
    return normalised, images


def flatten_content(messages: list[dict], image_text: str, video_text: str = "") -> list[dict]:
    """Messages with list content joined into one string (images as `image_text`, videos
    as `video_text`), for templates that only render string content."""
    marks = {"image": image_text, "video": video_text}
    flat = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = "".join(
                marks[part["type"]] if part["type"] in marks else part["text"] for part in content
            )
        flat.append({**message, "content": content})
    return flat
