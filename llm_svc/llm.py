"""Offline inference: `LLM(model_dir).generate(prompts, params, images=...)` on an
in-process engine; a VLM's images are encoded here by its own vision tower, each once."""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from llm_svc.engine import EngineConfig, InvalidRequestError, LLMEngine, SamplingParams
from llm_svc.engine.embeddings import VisionEmbeddingSource, image_prompt
from llm_svc.engine.engine import load_vlm_adapter
from llm_svc.engine.models import TextModelConfig
from llm_svc.engine.sequence import TokenLogprobs


@dataclass
class GenerateOutput:
    """One finished request: its prompt, generated ids and text, why it stopped."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    num_cached_tokens: int = 0


class LLM:
    """`LLM(model_dir, **engine_args)`: engine_args are EngineConfig fields. For a VLM the
    vision tower is loaded on the first image (`vision.num_encoded` counts encodes)."""

    def __init__(self, model_dir: str | Path, **engine_args) -> None:
        config = EngineConfig(model_dir=model_dir, **engine_args)
        architecture = TextModelConfig.from_model_dir(config.model_dir).architecture
        self.adapter = load_vlm_adapter(config.model_dir, architecture)
        self.vision: VisionEmbeddingSource | None = None
        if self.adapter is not None:
            adapter = self.adapter
            self.vision = VisionEmbeddingSource(
                lambda: adapter.vision_runner(device=config.device, dtype=config.torch_dtype)
            )
        self.engine = LLMEngine(config, embedding_source=self.vision)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        images: Sequence | None = None,
        use_tqdm: bool = True,
    ) -> list[GenerateOutput]:
        """Run every prompt to completion; results in input order.

        Pass text `prompts` or `prompt_token_ids` (one list of ids, or one per prompt).
        `images`: per prompt, a list of images (encoded bytes or PIL images) whose
        placeholders (the model's image token, one per image) the prompt holds in order; a
        single prompt may take a flat list. `sampling_params`: one shared by all, or one per
        prompt; they are copied, never changed. A request the engine refuses raises
        InvalidRequestError naming its index; then nothing runs. A request whose image
        cannot be encoded raises ImageFailedError after the others have finished.
        """
        texts, id_lists = self._normalise_prompts(prompts, prompt_token_ids)
        params = self._normalise_params(sampling_params, len(id_lists))
        image_lists = self._normalise_images(images, len(id_lists))
        results: dict[str, GenerateOutput] = {}
        order, keys = [], []
        try:
            for index, (ids, param) in enumerate(zip(id_lists, params, strict=True)):
                request_id = f"offline-{next(self._ids)}"
                try:
                    ids, items = self._with_images(ids, image_lists[index], keys)
                    self.engine.add_request(request_id, ids, param, items=items)
                except InvalidRequestError as error:
                    for added in order:
                        self.engine.abort(added)
                    self.engine.step()  # collect the aborts' outputs
                    raise InvalidRequestError(
                        f"prompt {index}: {error.field}", error.value, error.limit
                    ) from error
                order.append(request_id)
                results[request_id] = GenerateOutput(request_id, texts[index], list(ids))
            self._run(results, use_tqdm)
        finally:
            for key in keys:
                self.vision.unregister(key)
        return [results[request_id] for request_id in order]

    def _with_images(self, ids: list[int], images: list, keys: list[bytes]):
        """(padded ids, items) of a prompt with `images`; registers them for encoding."""
        if not images:
            return ids, None
        if self.vision is None:
            raise InvalidRequestError("images", len(images), "this model takes no images")
        padded, items, decoded = image_prompt(self.adapter, ids, images, self.engine.fingerprint)
        for item, image in zip(items, decoded, strict=True):
            self.vision.register(item.key, image)
            keys.append(item.key)
        return padded, items

    @staticmethod
    def _normalise_images(images, count: int) -> list[list]:
        if images is None:
            return [[] for _ in range(count)]
        lists = list(images)
        if count == 1 and lists and not isinstance(lists[0], (list, tuple)):
            lists = [lists]  # one prompt's images given flat
        if len(lists) != count:
            raise ValueError(f"{len(lists)} image lists for {count} prompts")
        return [list(each or []) for each in lists]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[GenerateOutput]:
        """Apply the model's chat template to one conversation (a list of {"role",
        "content"}) or to several, then generate.

        Content is a string or OpenAI-style parts. A VLM takes image parts:
        `{"type": "image", "image": <PIL image or encoded bytes>}` or
        `{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}` (offline:
        nothing is fetched, so only data URLs)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        texts, ids, images = [], [], []
        for index, conversation in enumerate(conversations):
            pictures = _chat_images(conversation, f"conversation {index}")
            if self.adapter is not None:
                try:
                    text = self.adapter.apply_chat_template(conversation)
                except ValueError as err:
                    raise InvalidRequestError("messages", index, str(err)) from None
                token_ids = self.adapter.encode_prompt(text)
            elif pictures:
                raise InvalidRequestError("images", len(pictures), "this model takes no images")
            else:
                text = self.tokenizer.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=True
                )
                token_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            texts.append(text)
            ids.append(token_ids)
            images.append(pictures)
        outputs = self.generate(
            sampling_params=sampling_params,
            prompt_token_ids=ids,
            images=images if any(images) else None,
            use_tqdm=use_tqdm,
        )
        return [replace(out, prompt=text) for out, text in zip(outputs, texts, strict=True)]

    def _normalise_prompts(self, prompts, prompt_token_ids):
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("pass exactly one of prompts and prompt_token_ids")
        if prompts is not None:
            texts = [prompts] if isinstance(prompts, str) else list(prompts)
            return texts, [self.tokenizer(text)["input_ids"] for text in texts]
        lists = list(prompt_token_ids)
        if lists and not isinstance(lists[0], Sequence):
            lists = [lists]  # one prompt given as a flat list of ids
        return [None] * len(lists), [list(ids) for ids in lists]

    @staticmethod
    def _normalise_params(sampling_params, count: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams() for _ in range(count)]
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params.clone() for _ in range(count)]
        params = [param.clone() for param in sampling_params]
        if len(params) != count:
            raise ValueError(f"{len(params)} sampling params for {count} prompts")
        return params

    def _run(self, results: dict[str, GenerateOutput], use_tqdm: bool) -> None:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(results), desc="generate", disable=not use_tqdm)
        failed: Exception | None = None
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    result = results.get(out.request_id)
                    if result is None:
                        continue
                    result.token_ids.extend(out.new_token_ids)
                    result.text += out.new_text
                    result.logprobs.extend(out.new_logprobs)
                    if out.error is not None:
                        failed = failed or out.error
                    if out.finished:
                        result.finish_reason = out.finish_reason
                        result.num_cached_tokens = out.num_cached_tokens
                        bar.update(1)
        finally:
            bar.close()
        if failed is not None:
            raise failed


def _chat_images(conversation: list[dict], where: str) -> list:
    """The images of a conversation's image parts, in order (PIL images or file bytes)."""
    found = []
    for message in conversation:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "image":
                if part.get("image") is None:
                    raise ValueError(f"{where}: an image part needs its 'image' (PIL or bytes)")
                found.append(part["image"])
            elif kind in ("image_url", "input_image"):
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                found.append(_data_url_bytes(url, where))
    return found


def _data_url_bytes(url: object, where: str) -> bytes:
    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url[:40] if isinstance(url, str) else url
        raise ValueError(
            f"{where}: image URL {shown!r} is not a data: URL; the offline LLM fetches "
            "nothing (pass the image's bytes as {'type': 'image', 'image': ...})"
        )
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise ValueError(f"{where}: an image data URL must be data:<mime>;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"{where}: image data URL is not valid base64: {err}") from None
