"""Multimodal references for the engine tests: prompts with images on the tiny Qwen2-VL
and Idefics3 checkpoints, and HF transformers' greedy output for them (the HF image
processor + model.generate), memoised per session."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from iris.models import load_adapter
from iris.multimodal import Modality, MultimodalItem, image_identity, pad_with_offsets

TIE_MARGIN = 2e-4
MIN_TOKENS = 4
FAMILIES = {
    "qwen2_vl": "tiny_qwen2_vl_dir",
    "idefics3": "tiny_idefics3_dir",
    "internvl": "tiny_internvl_dir",
    "mistral3": "tiny_mistral3_dir",
}


def make_image(seed: int, size: tuple[int, int] = (112, 112)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def image_key_bytes(image: Image.Image) -> bytes:
    """What the offline LLM hashes for a PIL image (its size and pixels)."""
    return f"{image.width}x{image.height}:".encode() + image.tobytes()


@dataclass
class MMPrompt:
    """One prompt with images: the placeholder ids (for LLM.generate), the expanded ids (for
    HF), the padded ids and items (for LLMEngine.add_request)."""

    ids: list[int]
    images: list[Image.Image]
    expanded: list[int]
    padded: list[int] = field(default_factory=list)
    items: list[MultimodalItem] = field(default_factory=list)


class MMReference:
    """Prompts and HF greedy continuations of one tiny VLM checkpoint."""

    def __init__(self, model_dir) -> None:
        self.model_dir = model_dir
        self.adapter = load_adapter(model_dir)
        self._model = None
        self._outputs: dict = {}

    @property
    def fingerprint(self) -> bytes:
        return self.adapter.fingerprint

    def prompt(self, text_parts: list[str], images: list[Image.Image]) -> MMPrompt:
        """Text parts interleaved with images (len(text_parts) == len(images) + 1)."""
        content = [{"type": "text", "text": text_parts[0]}]
        for image_text in text_parts[1:]:
            content += [{"type": "image"}, {"type": "text", "text": image_text}]
        return self.conversation([{"role": "user", "content": content}], images)

    def conversation(self, messages: list[dict], images: list[Image.Image]) -> MMPrompt:
        """A whole conversation (OpenAI-style messages whose image parts are
        `{"type": "image"}`, in the order of `images`)."""
        adapter = self.adapter
        rendered = adapter.apply_chat_template(messages)
        ids = adapter.encode_prompt(rendered)
        items, grids = [], []
        for image in images:
            count, grid = adapter.image_token_count(image.width, image.height)
            item = MultimodalItem(Modality.IMAGE, token_count=count, grid=tuple(grid))
            item.set_identity(image_identity(image_key_bytes(image), self.fingerprint))
            items.append(item)
            grids.append(grid)
        expanded, spans = adapter.expand_prompt(ids, grids)
        for item, item_spans in zip(items, spans, strict=True):
            item.offsets = [tuple(span) for span in item_spans]
        padded = pad_with_offsets(expanded, items).tolist()
        return MMPrompt(ids, list(images), expanded, padded, items)

    def embeddings(self, images: list[Image.Image]) -> list[torch.Tensor]:
        """What an encoder would store: the adapter's vision runner output per image."""
        runner = self.adapter.vision_runner()
        return runner.encode([runner.preprocess(image) for image in images])

    def _hf(self):
        if self._model is None:
            from transformers import AutoModelForImageTextToText

            self._model = AutoModelForImageTextToText.from_pretrained(
                str(self.model_dir), dtype=torch.float32
            ).eval()
        return self._model

    def _pixel_inputs(self, images: list[Image.Image], expanded: list[int]) -> dict:
        if self.adapter.architecture == "Gemma4ForConditionalGeneration":
            return self._gemma4_inputs(images, expanded)
        if self.adapter.bidirectional_image_spans:  # Gemma 3
            from transformers.models.gemma3.image_processing_pil_gemma3 import (
                Gemma3ImageProcessorPil,
            )

            out = Gemma3ImageProcessorPil.from_pretrained(str(self.model_dir))(
                images=images, return_tensors="pt"
            )
            # token_type_ids mark the image tokens: HF's bidirectional blocks come from them.
            types = (torch.tensor([expanded]) == self.adapter.image_token_id).int()
            return {"pixel_values": out["pixel_values"], "token_type_ids": types}
        if self.adapter.uses_mrope:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
                Qwen2VLImageProcessorPil,
            )

            out = Qwen2VLImageProcessorPil.from_pretrained(str(self.model_dir))(
                images=images, return_tensors="pt"
            )
            # Without mm_token_type_ids, HF's generate silently falls back to 1-D positions.
            types = (torch.tensor([expanded]) == self.adapter.image_token_id).int()
            return {
                "pixel_values": out["pixel_values"],
                "image_grid_thw": out["image_grid_thw"],
                "mm_token_type_ids": types,
            }
        if self.adapter.architecture == "InternVLForConditionalGeneration":
            return self._internvl_inputs(images, expanded)
        if self.adapter.architecture == "Mistral3ForConditionalGeneration":
            return self._mistral3_inputs(images)
        from transformers import Idefics3Processor

        processor = Idefics3Processor.from_pretrained(str(self.model_dir))
        out = processor.image_processor(images=[images], return_tensors="pt")
        return {
            "pixel_values": out["pixel_values"],
            "pixel_attention_mask": out["pixel_attention_mask"],
        }

    def _internvl_inputs(self, images: list[Image.Image], expanded: list[int]) -> dict:
        """InternVLProcessor's pixel values; its expansion of the prompt must be Iris's."""
        from iris.models.internvl.tiny import load_processor

        processor = load_processor(self.model_dir)
        text = self.adapter.tokenizer().decode(_collapsed(expanded, self.adapter))
        out = processor(images=images or None, text=[text], return_tensors="pt")
        assert out["input_ids"][0].tolist() == expanded, "the processor expands differently"
        return {"pixel_values": out["pixel_values"]} if images else {}

    def _gemma4_inputs(self, images: list[Image.Image], expanded: list[int]) -> dict:
        """Gemma4ImageProcessorPil's patches and positions; mm_token_type_ids mark the soft
        tokens (1 image, 2 video), from which HF builds the spans that attend both ways.
        A video's tensors come from the test (`greedy`'s `extra`: HF's video processor
        needs torchvision)."""
        from transformers.models.gemma4.image_processing_pil_gemma4 import (
            Gemma4ImageProcessorPil,
        )

        ids = torch.tensor([expanded])
        types = (ids == self.adapter.image_token_id).long()
        types += 2 * (ids == self.adapter.config.get("video_token_id", -1)).long()
        # Hidden states requested keep transformers from slicing the KV-shared layers' rows,
        # which fails on a model without per-layer inputs (5.24); the logits are the same.
        inputs: dict = {"mm_token_type_ids": types, "output_hidden_states": True}
        if images:
            out = Gemma4ImageProcessorPil.from_pretrained(str(self.model_dir))(
                images=images, return_tensors="pt"
            )
            inputs["pixel_values"] = out["pixel_values"]
            inputs["image_position_ids"] = out["image_position_ids"]
        return inputs

    def _mistral3_inputs(self, images: list[Image.Image]) -> dict:
        """Pixtral's PIL image processor at the processor's block size (PixtralProcessor
        itself imports torchvision, which does not import beside the CPU torch here)."""
        from transformers.models.pixtral.image_processing_pil_pixtral import (
            PixtralImageProcessorPil,
        )

        if not images:
            return {}
        block = self.adapter.rule.block
        out = PixtralImageProcessorPil.from_pretrained(str(self.model_dir))(
            images=images, patch_size={"height": block, "width": block}, return_tensors="pt"
        )
        return {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}

    def first_logprobs(self, prompt: MMPrompt) -> torch.Tensor:
        """HF's log-probabilities [vocab] of the first generated token."""
        ids = torch.tensor([prompt.expanded])
        with torch.inference_mode():
            out = self._hf()(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                **self._pixel_inputs(prompt.images, prompt.expanded),
            )
        return torch.log_softmax(out.logits[0, -1].float(), dim=-1)

    def greedy(self, prompt: MMPrompt, max_new_tokens: int, extra: dict | None = None) -> list[int]:
        """HF's greedy continuation of `prompt` with its images, cut before the first step
        whose top two logits are within TIE_MARGIN (random tiny weights make near-ties that
        fp32 rounding may break either way); at least MIN_TOKENS are kept. `extra`: more
        model inputs (a video's tensors, built by the test), part of the memo's key."""
        extra = extra or {}
        key = (tuple(prompt.expanded), tuple(image_key_bytes(i) for i in prompt.images))
        key = key + (max_new_tokens, tuple((k, v.numpy().tobytes()) for k, v in extra.items()))
        if key not in self._outputs:
            ids = torch.tensor([prompt.expanded])
            with torch.inference_mode():
                out = self._hf().generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=max_new_tokens,
                    do_sample=False,
                    output_scores=True,
                    return_dict_in_generate=True,
                    **self._pixel_inputs(prompt.images, prompt.expanded),
                    **extra,
                )
            tokens = out.sequences[0, len(prompt.expanded) :].tolist()
            for step, scores in enumerate(out.scores):
                top = scores[0].float().topk(2).values
                if float(top[0] - top[1]) < TIE_MARGIN:
                    tokens = tokens[:step]
                    break
            assert len(tokens) >= min(MIN_TOKENS, max_new_tokens), (
                f"reference cut to {tokens} by a near-tie: pick another prompt"
            )
            self._outputs[key] = tokens
        return self._outputs[key]


def _collapsed(expanded: list[int], adapter) -> list[int]:
    """`expanded` with each image's expansion back to its one placeholder (InternVL:
    <img> context... </img> becomes one context token, as the chat template writes it)."""
    tokenizer = adapter.tokenizer()
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<img>", "</img>"))
    out: list[int] = []
    inside = False
    for token in expanded:
        if token == start:
            inside = True
            out.append(adapter.image_token_id)
        elif token == end:
            inside = False
        elif not inside:
            out.append(token)
    return out


def same_tokens(got: list[int], reference: list[int]) -> bool:
    """The engine's greedy tokens agree with the (possibly tie-cut) reference."""
    return got[: len(reference)] == reference


class GatedSource:
    """Wraps an EmbeddingSource so fetches finish only once `open()` is called: requests
    added together then land together, which makes scheduling (and preemption) in a test
    independent of thread timing."""

    def __init__(self, inner) -> None:
        import threading

        self.inner = inner
        self.gate = threading.Event()

    def fetch(self, items, hidden, dtype):
        assert self.gate.wait(60), "gate never opened"
        return self.inner.fetch(items, hidden, dtype)

    def release(self, items) -> None:
        self.inner.release(items)

    def close(self) -> None:
        self.inner.close()


def admit_together(engine, source: GatedSource) -> None:
    """Step once (every queued request starts its fetch), open the gate, wait until every
    fetch has landed; the next step admits them all at once."""
    import concurrent.futures as cf

    engine.step()
    assert engine.scheduler.num_fetching == len(engine.requests), "all should be fetching"
    source.gate.set()
    cf.wait(list(engine.fetcher.inflight.values()), timeout=60)
