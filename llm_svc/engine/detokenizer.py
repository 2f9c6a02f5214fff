"""Incremental detokenization: text grows token by token without re-decoding everything.

Built on `tokenizers`' DecodeStream (one call into the Rust tokenizer per token), which
keeps multi-token characters (byte-level BPE) and leading-space rules right: text is only
released once it no longer ends in an incomplete character. Needs a fast tokenizer
(tokenizer.json), which every model Iris loads has.
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
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(
                f"{type(tokenizer).__name__} is a slow tokenizer; detokenizing needs a fast "
                "one (the model directory's tokenizer.json)"
            )
        self._backend = backend
        self._skip = skip_special_tokens
        vocab = len(tokenizer)
        # Multimodal sentinels are not tokens: leave them out of the context window.
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
