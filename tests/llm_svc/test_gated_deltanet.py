"""Gated DeltaNet's torch forms against transformers' own torch fallbacks (Qwen3.5), with the
state carried across chunks of 1, 7 and 64 tokens, and the causal conv's state likewise."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from llm_svc.engine.models.gated_deltanet import (
    causal_conv1d,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)

LENGTH, HK, HV, DK, DV = 150, 2, 4, 16, 8


def test_fla_is_not_importable():
    # transformers swaps its torch fallbacks for fla's kernels when fla imports, and those do
    # not run on the CPU: the references below would not be the torch code they claim.
    assert importlib.util.find_spec("fla") is None


def _hf():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    return hf


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, LENGTH, HK, DK, generator=gen)
    k = torch.randn(1, LENGTH, HK, DK, generator=gen)
    v = torch.randn(1, LENGTH, HV, DV, generator=gen)
    g = -F.softplus(torch.randn(1, LENGTH, HV, generator=gen))  # log-decays, <= 0
    beta = torch.rand(1, LENGTH, HV, generator=gen)
    return q, k, v, g, beta


def _reference(q, k, v, g, beta):
    out, state = _hf().torch_chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    return out, state


def test_recurrent_form_matches_hf_recurrent():
    q, k, v, g, beta = _inputs()
    expected, expected_state = _hf().torch_recurrent_gated_delta_rule(
        q, k, v, g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    out, state = recurrent_gated_delta_rule(q, k, v, g, beta, torch.zeros(1, HV, DK, DV))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, expected_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 64, LENGTH])
@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_state_carried_across_chunks_matches_hf_in_one_go(chunk, form):
    q, k, v, g, beta = _inputs(1)
    expected, expected_state = _reference(q, k, v, g, beta)
    rule = chunk_gated_delta_rule if form == "chunked" else recurrent_gated_delta_rule
    state, outs = torch.zeros(1, HV, DK, DV), []
    for start in range(0, LENGTH, chunk):
        part = slice(start, start + chunk)
        out, state = rule(q[:, part], k[:, part], v[:, part], g[:, part], beta[:, part], state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, expected_state, atol=1e-4, rtol=1e-4)


def test_chunked_form_batches_sequences_independently():
    q, k, v, g, beta = _inputs(2)
    halves = [x.chunk(2, dim=1) for x in (q, k, v, g, beta)]
    batched = [torch.cat(pair, dim=0) for pair in halves]
    out, state = chunk_gated_delta_rule(*batched, torch.zeros(2, HV, DK, DV), block=16)
    for row in range(2):
        alone = [pair[row] for pair in halves]
        expected, expected_state = _reference(*alone)
        torch.testing.assert_close(out[row : row + 1], expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(state[row : row + 1], expected_state, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_causal_conv_carries_its_state_across_chunks(chunk):
    gen = torch.Generator().manual_seed(3)
    channels, kernel = 12, 4
    x = torch.randn(1, channels, LENGTH, generator=gen)
    weight = torch.randn(channels, kernel, generator=gen)
    expected = _hf().causal_conv1d_fn(x, weight, None, activation="silu")[0].transpose(0, 1)
    state, outs = torch.zeros(channels, kernel - 1), []
    for start in range(0, LENGTH, chunk):
        out, state = causal_conv1d(x[0, :, start : start + chunk].transpose(0, 1), state, weight)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, x[0, :, -(kernel - 1) :])
