"""Per-key token buckets (gateway/key_limits.py) on a clock the test moves."""

import pytest

from gateway.errors import APIError
from gateway.key_limits import KeyLimits


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def limits(clock, **overrides) -> KeyLimits:
    options = dict(
        requests_per_s=2.0, request_burst=2, prompt_tokens_per_s=100.0, prompt_token_burst=500
    )
    return KeyLimits(**{**options, **overrides}, clock=clock)


def test_requests_refill_at_their_rate_up_to_the_burst():
    clock = Clock()
    buckets = limits(clock)
    buckets.admit("a")
    buckets.admit("a")
    with pytest.raises(APIError) as refused:
        buckets.admit("a")
    assert (refused.value.status, refused.value.retry_after) == (429, 1)
    buckets.admit("b")  # another key has its own bucket
    clock.now = 0.5  # one request refilled (2 per second)
    buckets.admit("a")
    clock.now = 100.0  # long idle: back to the burst, not beyond
    buckets.admit("a")
    buckets.admit("a")
    with pytest.raises(APIError):
        buckets.admit("a")


def test_a_prompt_over_the_burst_is_served_once_then_its_debt_is_repaid():
    clock = Clock()
    buckets = limits(clock, requests_per_s=0)
    buckets.admit("a")
    buckets.charge_prompt_tokens("a", 1200)  # 700 tokens of debt at 100 per second
    with pytest.raises(APIError) as refused:
        buckets.admit("a")
    assert refused.value.retry_after == 7
    assert "prompt tokens per second" in refused.value.message
    clock.now = 7.01
    buckets.admit("a")


def test_a_rate_of_zero_is_no_limit():
    buckets = limits(Clock(), requests_per_s=0, prompt_tokens_per_s=0)
    assert not buckets.enabled
    for _ in range(1000):
        buckets.admit(None)
        buckets.charge_prompt_tokens(None, 10**6)


def test_tokens_taken_before_the_work_refuse_a_key_already_in_debt():
    """Two video requests of one key admitted at once: the first takes its planned tokens
    before its decode (into debt), the second is refused where its decode would start."""
    clock = Clock()
    buckets = limits(clock, requests_per_s=0)
    buckets.admit("a")
    buckets.admit("a")
    buckets.take_prompt_tokens("a", 800)  # 300 tokens of debt
    with pytest.raises(APIError) as refused:
        buckets.take_prompt_tokens("a", 10)
    assert (refused.value.status, refused.value.retry_after) == (429, 3)
    assert buckets.level("a", "prompt tokens") == -300  # the refusal took nothing
    buckets.charge_prompt_tokens("a", -100)  # settled: the prompt came to 700
    assert buckets.level("a", "prompt tokens") == -200
    buckets.take_prompt_tokens("b", 800)  # another key is not held back
