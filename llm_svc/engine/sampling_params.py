"""Per-request sampling parameters, checked at the engine's boundary."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from llm_svc.engine.errors import InvalidRequestError
from llm_svc.engine.grammar.spec import Constraint

MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries (OpenAI's limit)
LOGIT_BIAS_RANGE = 100.0


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 is exact argmax. top_k 0 (or -1), top_p 1 and min_p 0 are off; min_p in
    [0, 1] drops the tokens less likely than min_p × the most likely one (after top-k and
    top-p). repetition_penalty
    (> 0, 1 = off) scales the logits of every token seen in prompt or output;
    frequency_penalty / presence_penalty in [-2, 2] subtract count × f and p from the logits
    of tokens already generated. `seed` makes one request's sampling reproducible whatever
    it is batched with. `logprobs` = n returns the sampled token's log-probability and the n
    most likely (0 ≤ n ≤ 20; None = none), from the model's distribution before penalties
    and temperature. Stop strings are trimmed from the text unless include_stop_str_in_output.

    `logit_bias` {token id: value in [-100, 100]} (at most 300) is added to the logits, and
    `constraint` (a JSON schema, regex, grammar...) masks every token its grammar does not
    allow, before penalties, sampling and logprobs. A constrained request also ends when its
    grammar is complete and its stop token accepted. With `reasoning` (a thinking model's
    request), the output opens with a thought and the constraint masks only what follows the
    model's end-of-thought token.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0  # no EOS or stop token id (nor stop string) before this many
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] = field(default_factory=dict)
    constraint: Constraint | None = None
    # The output opens with a thought: `constraint` starts after the end-of-thought token.
    reasoning: bool = False

    def clone(self) -> SamplingParams:
        return copy.deepcopy(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    def validate(self, vocab_size: int) -> None:
        """Raise InvalidRequestError naming the first bad value and its limit."""
        for name, kind in _NUMBER_FIELDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise InvalidRequestError(
                    name, value, "must be an integer" if kind is int else "must be a number"
                )
        _check("temperature", self.temperature, self.temperature >= 0.0, ">= 0")
        _check("top_p", self.top_p, 0.0 < self.top_p <= 1.0, "in (0, 1]")
        _check("top_k", self.top_k, self.top_k >= -1, "-1, 0 (off) or > 0")
        _check("min_p", self.min_p, 0.0 <= self.min_p <= 1.0, "in [0, 1]")
        _check("repetition_penalty", self.repetition_penalty, self.repetition_penalty > 0, "> 0")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check(name, value, -2.0 <= value <= 2.0, "in [-2, 2]")
        _check("max_tokens", self.max_tokens, self.max_tokens >= 1, ">= 1")
        ok = isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens
        _check("min_tokens", self.min_tokens, ok, f"in [0, max_tokens = {self.max_tokens}]")
        if self.seed is not None:
            _check("seed", self.seed, 0 <= self.seed < 2**63, "in [0, 2^63)")
        if self.logprobs is not None:
            limit = f"in [0, {MAX_TOP_LOGPROBS}]"
            _check("logprobs", self.logprobs, 0 <= self.logprobs <= MAX_TOP_LOGPROBS, limit)
        for stop in self.stop:
            _check("stop", stop, isinstance(stop, str) and stop != "", "non-empty strings")
        for token in self.stop_token_ids:
            _check("stop_token_ids", token, 0 <= token < vocab_size, f"in [0, {vocab_size})")
        self._validate_logit_bias(vocab_size)

    def _validate_logit_bias(self, vocab_size: int) -> None:
        bias = self.logit_bias
        count = len(bias)
        _check("logit_bias", count, count <= MAX_LOGIT_BIAS, f"at most {MAX_LOGIT_BIAS} entries")
        for token, value in bias.items():
            ok = isinstance(token, int) and not isinstance(token, bool) and 0 <= token < vocab_size
            _check("logit_bias", token, ok, f"token ids in [0, {vocab_size})")
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            in_range = number and -LOGIT_BIAS_RANGE <= value <= LOGIT_BIAS_RANGE
            _check(f"logit_bias[{token}]", value, in_range, "in [-100, 100]")


_NUMBER_FIELDS = {
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": int,
    "min_p": (int, float),
    "repetition_penalty": (int, float),
    "frequency_penalty": (int, float),
    "presence_penalty": (int, float),
    "max_tokens": int,
}


def _check(name: str, value, ok: bool, limit: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        raise InvalidRequestError(name, value, f"must be {limit}")
