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


# A router decision may flip only where TP 1's k-th and (k+1)-th expert scores were this close.
ROUTER_NEAR_TIE = 1e-4


def compare_routers(reference: list, parallel: list, label: str) -> list[str]:
    """Compare two runs' router decisions, call by call (each a (experts [T, k] sorted,
    boundary gap [T]) pair, as tests/llm_svc/test_tensor_parallel_families.py records
    them): a token's expert set may differ only where TP 1's gap between the k-th and the
    (k+1)-th score was below ROUTER_NEAR_TIE. Returns the flips found."""
    assert len(reference) == len(parallel), f"{label}: {len(reference)} vs {len(parallel)} calls"
    flips = []
    for call, ((one, gap), (two, _)) in enumerate(zip(reference, parallel, strict=True)):
        assert one.shape == two.shape, f"{label} router call {call}"
        for token in (one != two).any(dim=1).nonzero().flatten().tolist():
            assert gap[token] < ROUTER_NEAR_TIE, (
                f"{label} router call {call} token {token}: experts {one[token].tolist()} vs "
                f"{two[token].tolist()}, TP 1's boundary gap {gap[token]:.2e} is not a near-tie"
            )
            flips.append(f"{label} router call {call} token {token} (gap {gap[token]:.1e})")
    return flips
