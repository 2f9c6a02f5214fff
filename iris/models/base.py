"""The model adapter contract: what Iris needs to know about one model family.

An adapter is built from a local HF model directory. Counting, prompt expansion, the chat
template and the token contract need no torch (the gateway imports them); the vision runner
and the weights do, and import it lazily.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from iris.models.checkpoint import (
    find_prefix,
    read_config,
    read_json,
    read_preprocessor,
    weight_files,
)
from iris.models.contract import check_token_contract
from iris.models.messages import flatten_content, to_template_messages
from iris.models.quantization import QuantScheme, read_quantization
from iris.models.reasoning import ReasoningSupport, probe_reasoning
from iris.models.tool_format import (
    HERMES,
    ToolCallFormat,
    for_tool_template,
    format_of_template,
    with_tool_instruction,
)
from iris.multimodal import processor_fingerprint

if TYPE_CHECKING:
    from iris.models.runner import VisionRunner

Grid = tuple[int, ...]
Span = tuple[int, int]


class ModelAdapter(ABC):
    """One model family's rules, bound to one checkpoint directory."""

    architectures: ClassVar[tuple[str, ...]] = ()
    # The decoder family of its language model, which the engine builds ("llama", "qwen2", ...).
    text_family: ClassVar[str]
    image_token: ClassVar[str]
    image_placeholder_text: ClassVar[str]
    # The token marking one image in a rendered prompt, which `expand_prompt` replaces
    # (None: the image token itself; Gemma 3: <start_of_image>).
    placeholder_token: ClassVar[str | None] = None
    # Whether an image span's tokens attend to each other both ways during prefill (Gemma
    # 3): such spans are never cut by a prefill chunk or a resumed prefix.
    bidirectional_image_spans: ClassVar[bool] = False
    uses_mrope: ClassVar[bool] = False
    # False for a plain language model (iris.models.text_only): an image part is refused.
    takes_images: ClassVar[bool] = True
    # Video (docs/design/multimodal.md): a family that takes it sets these and implements
    # `video_sampling`, `video_group_token_count` and `expand_video` (one item per frame group).
    takes_video: ClassVar[bool] = False
    video_placeholder_text: ClassVar[str] = ""

    @classmethod
    def text_family_of(cls, config: dict) -> str:
        """The decoder family of this checkpoint's language model. A family whose language
        model varies (InternVL: Qwen2, Qwen3 or Qwen3-MoE) reads it from `config`, and
        raises UnsupportedModelError naming an option it does not serve."""
        return cls.text_family

    def __init__(
        self, model_dir: str | Path, config: dict | None = None, revision: str = ""
    ) -> None:
        self.model_dir = Path(model_dir)
        self.config = config if config is not None else read_config(self.model_dir)
        self.preprocessor = read_preprocessor(self.model_dir)
        self.fingerprint: bytes = processor_fingerprint(self.model_dir, revision)

    # -- model facts -------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        return self.config["architectures"][0]

    @cached_property
    def text_config(self) -> dict:
        """The language model's config (nested `text_config`, or the flat legacy layout)."""
        nested = self.config.get("text_config")
        if nested:
            return dict(nested)
        return {k: v for k, v in self.config.items() if k not in ("vision_config",)}

    @property
    def hidden_size(self) -> int:
        return int(self.text_config["hidden_size"])

    # Deepstack levels carried by each embedding row after the main one (Qwen3-VL: one per
    # vision_config.deepstack_visual_indexes entry; 0 for every other family).
    deepstack_levels: int = 0

    @property
    def embedding_width(self) -> int:
        """Width of one embedding row as encoded, cached and fetched: the main row, then
        one row of every deepstack level ((1 + levels) x hidden_size)."""
        return self.hidden_size * (1 + self.deepstack_levels)

    @property
    def vocab_size(self) -> int:
        return int(self.text_config.get("vocab_size", self.config.get("vocab_size")))

    @property
    def image_token_id(self) -> int | None:
        value = self.config.get("image_token_id", self.config.get("image_token_index"))
        return int(value) if value is not None else None

    @property
    def max_uncut_span(self) -> int:
        """The longest image span a prefill chunk must take whole (0: none must)."""
        return 0

    @property
    def placeholder_id(self) -> int | None:
        """The id of `placeholder_token` (the image token's id when there is none)."""
        if self.placeholder_token is None:
            return self.image_token_id
        return self.tokenizer().convert_tokens_to_ids(self.placeholder_token)

    @property
    def placeholder_marker(self) -> str:
        """The text of one image's placeholder token in a rendered prompt."""
        return self.placeholder_token or self.image_token

    @cached_property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends generation: the tokenizer's EOS, the text config's and
        generation_config.json's eos_token_id (each may be a list), sorted."""
        ids: set[int] = set()
        generation = read_json(self.model_dir / "generation_config.json") or {}
        for value in (generation.get("eos_token_id"), self.text_config.get("eos_token_id")):
            if value is not None:
                ids.update(value if isinstance(value, list) else [value])
        if self.tokenizer().eos_token_id is not None:
            ids.add(self.tokenizer().eos_token_id)
        return sorted(int(i) for i in ids)

    @cached_property
    def quantization(self) -> QuantScheme | None:
        """The checkpoint's FP8 layout (None: unquantized); load_adapter has refused others."""
        return read_quantization(self.config)

    @cached_property
    def weight_names(self) -> list[str]:
        """All tensor names in the checkpoint's safetensors (headers only)."""
        return sorted(weight_files(self.model_dir))

    @cached_property
    def text_weight_prefix(self) -> str:
        """Prefix p such that p + 'layers.0.self_attn.q_proj.weight', p + 'embed_tokens.weight'
        and p + 'norm.weight' are the language model's tensors in this checkpoint."""
        prefix = find_prefix(self.weight_names, "embed_tokens.weight", exclude=self._vision_markers)
        if prefix is None:
            raise ValueError(f"no language model embed_tokens.weight in {self.model_dir}")
        return prefix

    @cached_property
    def lm_head_name(self) -> str:
        """The tensor holding the output projection (the embeddings when they are tied)."""
        names = set(self.weight_names)
        for name in ("lm_head.weight", "model.lm_head.weight"):
            if name in names:
                return name
        return self.text_weight_prefix + "embed_tokens.weight"

    _vision_markers: ClassVar[tuple[str, ...]] = ("visual", "vision")

    # -- tokens and prompts -----------------------------------------------------------------

    @cached_property
    def _tokenizer(self):
        # The fast tokenizer class loads tokenizer.json + tokenizer_config.json without
        # importing torch (AutoTokenizer would).
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(self.model_dir))

    def tokenizer(self):
        """The checkpoint's tokenizer (loaded once per adapter)."""
        return self._tokenizer

    def apply_chat_template(
        self,
        messages: Sequence[dict],
        add_generation_prompt: bool = True,
        tools: Sequence[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> str:
        """Render OpenAI-style messages; each image part becomes `image_placeholder_text`.
        `tools` (OpenAI tool objects) go through the template when it renders them, else
        into the adapter's own system instruction (iris.models.tool_format).
        `template_kwargs` (e.g. `enable_thinking`, checked by the caller) go to the template.

        Raises ValueError if the rendered prompt's placeholders do not match the number of
        images (for example a user's text that spells out the placeholder token). For the
        ids to serve, use `chat_prompt_ids`: this text, tokenized, would turn a special
        token typed in a message into a control token.
        """
        template_messages, images, extra = self._template_inputs(messages, tools)
        extra.update(template_kwargs or {})
        tokenizer = self.tokenizer()
        prompt = tokenizer.apply_chat_template(
            template_messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )
        if self.takes_images and prompt.count(self.placeholder_marker) != images:
            # Some templates render only string content: give them the flattened form.
            prompt = tokenizer.apply_chat_template(
                flatten_content(
                    template_messages, self.image_placeholder_text, self.video_placeholder_text
                ),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        found = prompt.count(self.placeholder_marker) if self.takes_images else 0
        self._check_placeholders(found, images)
        return prompt

    def chat_prompt_ids(
        self,
        messages: Sequence[dict],
        add_generation_prompt: bool = True,
        tools: Sequence[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> list[int]:
        """The token ids of the rendered messages, where only the chat template emits
        control tokens: a special token spelled inside a message's text, a tool's
        description or a call's arguments is tokenized as the text it is (transformers'
        `sanitize_control_tokens`), so a user cannot forge a system turn or an image
        placeholder. An honest prompt's ids are those of `encode_prompt(apply_chat_template)`.

        Raises ValueError if the ids' image placeholders do not match the images.
        """
        template_messages, images, extra = self._template_inputs(messages, tools)
        extra.update(template_kwargs or {})
        tokenizer = self.tokenizer()
        encoded = tokenizer.apply_chat_template(
            template_messages,
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            sanitize_control_tokens=True,
            **extra,
        )
        ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        found = ids.count(self.placeholder_id)
        if found != images:
            # A template that renders only string content: the placeholders would be text
            # here, so render the flattened form and tokenize it (its control tokens are not
            # sanitized; no registered family needs this path).
            ids = self.encode_prompt(
                self.apply_chat_template(messages, add_generation_prompt, tools, template_kwargs)
            )
            found = ids.count(self.placeholder_id)
        self._check_placeholders(found, images)
        return ids

    def _check_placeholders(self, found: int, images: int) -> None:
        """ValueError unless the rendered prompt holds one placeholder per image."""
        if found != images:
            raise ValueError(
                f"prompt has {found} image placeholder(s) {self.placeholder_marker!r} "
                f"for {images} image(s)"
            )

    def _template_inputs(
        self, messages: Sequence[dict], tools: Sequence[dict] | None
    ) -> tuple[list[dict], int, dict]:
        """(template messages, number of images, extra template arguments)."""
        extra = {}
        if self.template_renders_tools:
            messages = for_tool_template(messages)
            if tools:
                extra["tools"] = list(tools)
        else:
            messages = with_tool_instruction(messages, tools, self.tool_call_format)
        template_messages, images = to_template_messages(messages)
        return template_messages, images, extra

    @cached_property
    def template_renders_tools(self) -> bool:
        """Whether the chat template renders a `tools` list: the same probe conversation
        rendered with and without a tool comes out different."""
        probe = [{"role": "user", "content": "probe"}]
        tool = {
            "type": "function",
            "function": {"name": "iris_probe_tool", "parameters": {"type": "object"}},
        }
        tokenizer = self.tokenizer()
        try:
            plain = tokenizer.apply_chat_template(probe, tokenize=False)
            with_tool = tokenizer.apply_chat_template(probe, tokenize=False, tools=[tool])
        except Exception:  # a template that fails on tools does not support them
            return False
        return plain != with_tool

    @cached_property
    def tool_call_format(self) -> ToolCallFormat:
        """How the model writes tool calls: read from a template that renders tools (Qwen
        XML when it writes `<function=...>`, as Qwen3.5's does), else Hermes, which is
        also what Iris's own instruction shows a template without tools."""
        if not self.template_renders_tools:
            return HERMES
        tokenizer = self.tokenizer()
        probe_user = {"role": "user", "content": "probe"}
        return format_of_template(
            lambda call: tokenizer.apply_chat_template(
                for_tool_template([probe_user, call]), tokenize=False
            )
        )

    @cached_property
    def reasoning(self) -> ReasoningSupport | None:
        """Whether the model thinks, and which reasoning fields its chat template takes
        (iris.models.reasoning); None for a model that does not think."""
        return probe_reasoning(self.tokenizer())

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of a rendered prompt (the template already holds the special tokens)."""
        return self.tokenizer()(prompt, add_special_tokens=False)["input_ids"]

    def check_token_contract(self) -> None:
        """Fail fast (TokenContractError / ValueError) if tokenizer and config disagree."""
        check_token_contract(
            tokenizer=self.tokenizer(),
            text_config=self.text_config,
            image_token=self.image_token,
            image_token_id=self.image_token_id,
            vocab_size=self.vocab_size,
        )

    def _placeholder_positions(self, input_ids: Sequence[int], grids: Sequence[Grid]) -> list[int]:
        image_id = self.placeholder_id
        positions = [i for i, token in enumerate(input_ids) if token == image_id]
        if len(positions) != len(grids):
            raise ValueError(
                f"prompt has {len(positions)} image placeholder(s) but {len(grids)} grid(s) "
                "were given"
            )
        return positions

    # -- per family --------------------------------------------------------------------------

    @abstractmethod
    def image_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        """(token_count, grid) of an image of this (EXIF-rotated) size, from the processor's
        resize rules alone."""

    @abstractmethod
    def expand_prompt(
        self, input_ids: Sequence[int], grids: Sequence[Grid]
    ) -> tuple[list[int], list[list[Span]]]:
        """Replace each image placeholder in `input_ids` with the family's full expansion.

        Returns the new ids and, per image, its inclusive spans of image tokens in them, in
        the order of that image's embedding rows. The number of placeholders must equal
        len(grids) (ValueError naming both).
        """

    @abstractmethod
    def vision_runner(self, device: Any = "cpu", dtype: Any = None) -> VisionRunner:
        """The vision tower + projector of this checkpoint (imports torch)."""

    def expand_media(
        self,
        input_ids: Sequence[int],
        image_grids: Sequence[Grid],
        videos: Sequence[tuple[Sequence[float], Grid]] = (),
    ) -> tuple[list[int], list[list[Span]], list[list[Span]]]:
        """`expand_prompt` for the images, then each video placeholder (the video token, in
        order) expanded by `expand_video` with its groups' (timestamps, grid). Returns the
        ids, each image's spans and each video's per-group spans. ValueError when the
        placeholders and the media do not match."""
        expanded, image_spans = self.expand_prompt(input_ids, image_grids)
        if not videos:
            if self.takes_video and self.video_token_id in expanded:
                raise ValueError("prompt has a video placeholder but no video was given")
            return expanded, image_spans, []
        if not self.takes_video:
            raise ValueError(f"model {self.architecture} takes no video")
        positions = [i for i, token in enumerate(expanded) if token == self.video_token_id]
        if len(positions) != len(videos):
            raise ValueError(
                f"prompt has {len(positions)} video placeholder(s) for {len(videos)} video(s)"
            )
        video_spans: list[list[Span]] = [[] for _ in videos]
        # Last first: an expansion moves only the spans after it.
        for index in reversed(range(len(videos))):
            position = positions[index]
            timestamps, grid = videos[index]
            before = len(expanded)
            expanded, spans = self.expand_video(expanded, position, timestamps, grid)
            shift = len(expanded) - before

            def moved(span: Span, shift: int = shift, position: int = position) -> Span:
                return (span[0] + shift, span[1] + shift) if span[0] > position else span

            image_spans = [[moved(span) for span in spans_] for spans_ in image_spans]
            video_spans = [[moved(span) for span in spans_] for spans_ in video_spans]
            video_spans[index] = list(spans)
        return expanded, image_spans, video_spans

    def mrope_positions(self, input_ids_len: int, items: Sequence[Any]):
        """M-RoPE position ids [3, N] and the delta; only for families with `uses_mrope`."""
        raise NotImplementedError(f"{type(self).__name__} does not use M-RoPE")
