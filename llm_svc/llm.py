"""Offline inference: `LLM(model_dir).generate(prompts, params)` on an in-process engine."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from llm_svc.engine import EngineConfig, InvalidRequestError, LLMEngine, SamplingParams
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
    """`LLM(model_dir, **engine_args)`: engine_args are EngineConfig fields."""

    def __init__(self, model_dir: str | Path, **engine_args) -> None:
        self.engine = LLMEngine(EngineConfig(model_dir=model_dir, **engine_args))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        use_tqdm: bool = True,
    ) -> list[GenerateOutput]:
        """Run every prompt to completion; results in input order.

        Pass text `prompts` or `prompt_token_ids` (one list of ids, or one per prompt).
        `sampling_params`: one shared by all, or one per prompt; they are copied, never
        changed. A request the engine refuses raises InvalidRequestError naming its index;
        then nothing runs.
        """
        texts, id_lists = self._normalise_prompts(prompts, prompt_token_ids)
        params = self._normalise_params(sampling_params, len(id_lists))
        results: dict[str, GenerateOutput] = {}
        order = []
        for index, (ids, param) in enumerate(zip(id_lists, params, strict=True)):
            request_id = f"offline-{next(self._ids)}"
            try:
                self.engine.add_request(request_id, ids, param)
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
        return [results[request_id] for request_id in order]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[GenerateOutput]:
        """Apply the model's chat template to one conversation (a list of {"role",
        "content"}) or to several, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        texts = [
            self.tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=True
            )
            for conversation in conversations
        ]
        ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        outputs = self.generate(
            sampling_params=sampling_params, prompt_token_ids=ids, use_tqdm=use_tqdm
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
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    result = results.get(out.request_id)
                    if result is None:
                        continue
                    result.token_ids.extend(out.new_token_ids)
                    result.text += out.new_text
                    result.logprobs.extend(out.new_logprobs)
                    if out.finished:
                        result.finish_reason = out.finish_reason
                        result.num_cached_tokens = out.num_cached_tokens
                        bar.update(1)
        finally:
            bar.close()
