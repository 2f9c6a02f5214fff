"""Which kernels run Qwen3.5's gated delta rule, and the arguments Iris hands fla-core.

fla-core (the `cuda` extra) is never installed here and its Triton kernels need CUDA, so
what runs on the CPU is: the dispatch (torch on the CPU always; a clear error when fla is
forced without fla-core or off CUDA; torch with a warning on CUDA without it), and the
adapter (`fla_kernels`, `fla_arguments`) driven through `fla_contract` below, a per-token
statement of what fla 0.6's `chunk_gated_delta_rule` / `fused_recurrent_gated_delta_rule`
compute from those arguments, written from their documented signatures and kernels:
[B, T, H, K] inputs, value head j reading key head j // (HV / H), q/k L2-normalised in the
kernel by x / sqrt(sum x^2 + 1e-6), q times `scale`, g the log-decay, beta used as given,
states [N, HV, K, V], sequences cut by `cu_seqlens`. Its keyword-only signature refuses an
argument fla does not take. The kernels' own parity is a device check
(bench/gdn_device_check.py), not run here.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
import torch.nn.functional as F

from llm_svc.engine import EngineConfig
from llm_svc.engine.models.gated_deltanet import (
    FLA_MISSING,
    TORCH,
    choose_kernels,
    fla_kernels,
)
from tests.llm_svc.checkpoints import tiny_checkpoint

HK, HV, DK, DV = 2, 4, 16, 8


def fla_contract(
    q, k, v, g, beta, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
    use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, state_v_first=False,
    cu_seqlens=None, cu_seqlens_cpu=None,
):  # fmt: skip
    assert output_final_state and use_qk_l2norm_in_kernel
    assert not (use_gate_in_kernel or use_beta_sigmoid_in_kernel or state_v_first)
    assert g.dtype == torch.float32 and initial_state.dtype == torch.float32
    batch, length, heads = q.shape[:3]
    if cu_seqlens is not None:
        assert batch == 1 and cu_seqlens.tolist() == cu_seqlens_cpu.tolist()
        bounds = cu_seqlens_cpu.tolist()
        spans = [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]
    else:
        spans = [(b, 0, length) for b in range(batch)]
    reads = torch.arange(v.shape[2]) // (v.shape[2] // heads)  # the key head of each value head
    out = torch.empty(v.shape, dtype=torch.float32)
    finals = []
    for n, (b, start, end) in enumerate(spans):
        state = initial_state[n].clone()  # [HV, K, V]
        for t in range(start, end):
            qt, kt = q[b, t, reads].float(), k[b, t, reads].float()
            qt = qt / torch.sqrt((qt * qt).sum(-1, keepdim=True) + 1e-6) * scale
            kt = kt / torch.sqrt((kt * kt).sum(-1, keepdim=True) + 1e-6)
            state = state * g[b, t].exp()[:, None, None]
            correction = v[b, t].float() - (state * kt[:, :, None]).sum(1)
            state = state + kt[:, :, None] * (beta[b, t].float()[:, None] * correction)[:, None, :]
            out[b, t] = (state * qt[:, :, None]).sum(1)
        finals.append(state)
    return out.to(v.dtype), torch.stack(finals)


def _packed(lens: list[int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    q = torch.randn(1, total, HK, DK, generator=gen)
    k = torch.randn(1, total, HK, DK, generator=gen)
    v = torch.randn(1, total, HV, DV, generator=gen)
    g = -F.softplus(torch.randn(1, total, HV, generator=gen))
    beta = torch.rand(1, total, HV, generator=gen)
    states = torch.randn(len(lens), HV, DK, DV, generator=gen)
    return q, k, v, g, beta, states


def test_fla_is_not_installed_here():
    assert importlib.util.find_spec("fla") is None


def test_the_cpu_always_runs_torch():
    for setting in ("auto", "torch"):
        assert choose_kernels(setting, torch.device("cpu")) is TORCH


def test_forcing_fla_off_cuda_or_without_fla_core_is_a_clear_error():
    with pytest.raises(ValueError, match="fla runs on CUDA only"):
        choose_kernels("fla", torch.device("cpu"))
    # On CUDA (no device is touched before the import fails).
    with pytest.raises(ModuleNotFoundError) as failed:
        choose_kernels("fla", torch.device("cuda"))
    assert str(failed.value) == FLA_MISSING and "`cuda` extra" in FLA_MISSING


def test_auto_on_cuda_without_fla_core_runs_torch_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert choose_kernels("auto", torch.device("cuda")) is TORCH
    assert "fla-core is not installed" in caplog.text


def test_the_setting_is_checked_by_the_engine_config():
    with pytest.raises(ValueError, match="linear_attention_kernels must be one of"):
        EngineConfig(tiny_checkpoint("qwen3_5"), device="cpu", linear_attention_kernels="cuda")


def test_the_fla_adapter_computes_the_torch_rule_for_packed_prefills():
    lens = [1, 70, 5, 64]  # one token, two 64-token blocks, short, exactly one block
    q, k, v, g, beta, states = _packed(lens, seed=0)
    adapter = fla_kernels(chunk=fla_contract, recurrent=fla_contract)
    out, final = adapter.chunk(q, k, v, g, beta, states, lens)
    expected, expected_final = TORCH.chunk(q, k, v, g, beta, states, lens)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, expected_final, atol=1e-4, rtol=1e-4)


def test_the_fla_adapter_computes_the_torch_rule_for_batched_decodes():
    q, k, v, g, beta, states = _packed([1, 1, 1], seed=1)
    decode = [x.transpose(0, 1) for x in (q, k, v, g, beta)]  # [3 sequences, 1 token, ...]
    adapter = fla_kernels(chunk=fla_contract, recurrent=fla_contract)
    out, final = adapter.recurrent(*decode, states)
    expected, expected_final = TORCH.recurrent(*decode, states)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, expected_final, atol=1e-5, rtol=1e-5)
