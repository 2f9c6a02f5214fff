"""Incremental detokenization: text grows token by token without re-decoding everything.

Decoding a window of recent ids and diffing against the window without the newest ids
keeps multi-token characters (byte-level BPE) and leading-space rules right: text is only
released once it no longer ends in an incomplete character (U+FFFD).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers.decoders import DecodeStream

# Prompt tokens decoded as context so the first output token's spacing is right.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        vocab = len(tokenizer)
        # Multimodal sentinels are not tokens: leave them out of the context window.
        context = [i for i in prompt_ids[-_CONTEXT_TOKENS:] if 0 <= i < vocab]
        self.ids = list(context)
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one token; returns the text it completes (possibly empty)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """At the end: whatever `add` held back (an incomplete character decodes as U+FFFD)."""
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return after[len(before) :]


class StreamDetokenizer:
    """The same contract as IncrementalDetokenizer over `tokenizers`' DecodeStream (one
    Rust call per token); needs a fast tokenizer (`backend_tokenizer`)."""

    def __init__(
        self, tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        self._backend = tokenizer.backend_tokenizer
        self._skip = skip_special_tokens
        vocab = len(tokenizer)
        context = [i for i in prompt_ids[-_CONTEXT_TOKENS:] if 0 <= i < vocab]
        self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []  # tokens whose text the stream has not released yet

    def add(self, token_id: int) -> str:
        """Append one token; returns the text it completes (possibly empty)."""
        text = self._stream.step(self._backend, token_id)
        if text is None:
            self._held.append(token_id)
            return ""
        self._held.clear()
        return text

    def flush(self) -> str:
        """At the end: whatever `add` held back (an incomplete character decodes as U+FFFD)."""
        held, self._held = self._held, []
        return self._backend.decode(held, skip_special_tokens=self._skip) if held else ""
