"""Comparing a tensor-parallel run with TP 1's: tokens equal except at near-ties, log-probs
close elsewhere (tests/llm_svc/test_tensor_parallel.py, tests/e2e/test_tensor_parallel.py)."""

from __future__ import annotations

# A reordered float32 sum may flip a choice whose top two log-probs are this close.
NEAR_TIE = 1e-3
LOGPROB_TOLERANCE = 1e-4


def compare_runs(reference, parallel, label: str) -> list[str]:
    """Assert that each of `parallel`'s outputs matches `reference`'s (GenerateOutput, with
    top-2 logprobs); returns the near-tie flips found (after a flip the two runs continue
    from different tokens, so the rest of that request is not compared)."""
    flips = []
    assert len(reference) == len(parallel)
    for index, (one, two) in enumerate(zip(reference, parallel, strict=True)):
        where = f"{label} request {index}"
        for pos, (left, right) in enumerate(zip(one.logprobs, two.logprobs, strict=True)):
            if left.token_id != right.token_id:
                gap = left.top[0][1] - left.top[1][1]
                assert gap < NEAR_TIE, (
                    f"{where} token {pos}: {left.token_id} vs {right.token_id}, "
                    f"TP 1's top-2 gap {gap:.2e} is not a near-tie"
                )
                flips.append(f"{where} token {pos} (gap {gap:.1e})")
                break
            assert abs(left.logprob - right.logprob) < LOGPROB_TOLERANCE, f"{where} token {pos}"
            for (a_id, a_lp), (b_id, b_lp) in zip(left.top, right.top, strict=True):
                if a_id == b_id:
                    assert abs(a_lp - b_lp) < LOGPROB_TOLERANCE, f"{where} token {pos} top"
        else:
            assert one.token_ids == two.token_ids, where
    return flips
