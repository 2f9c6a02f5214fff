"""Gated DeltaNet linear attention (Qwen3.5's `linear_attention` layers) in plain torch.

Per value head the layer keeps a recurrent state S [key_dim, value_dim]; each token t decays
it by exp(g_t), corrects what it predicts for the token's key towards the token's value
with learning rate beta_t (the delta rule), and reads it with the query:

    S  <- exp(g_t) * S
    u_t = beta_t * (v_t - S^T k_t)
    S  <- S + k_t u_t^T
    o_t = S^T q_t

The recurrence runs in fp32 whatever the weights' dtype (as the reference does). Two forms
give the same result: `recurrent_gated_delta_rule` steps token by token (decode: one token
per sequence, batched over sequences); `chunk_gated_delta_rule` solves blocks of tokens at
once with a triangular system (prefill). Before the rule a depthwise causal conv1d mixes the
last `kernel` inputs of each channel; it carries the previous `kernel - 1` inputs as the
conv state, so a prefill split into chunks equals one prefill.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dimension (the reference's epsilon placement)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta):
    """[B, T, Hk|Hv, d] inputs → fp32 [B, Hv, T, d] with q/k L2-normalised, q scaled, and
    each key head shared by its group of value heads."""
    groups = v.shape[2] // k.shape[2]
    if groups > 1:
        q = q.repeat_interleave(groups, dim=2)
        k = k.repeat_interleave(groups, dim=2)
    q, k, v = (x.transpose(1, 2).float() for x in (q, k, v))
    g, beta = (x.transpose(1, 2).float() for x in (g, beta))
    q = l2_normalize(q) * q.shape[-1] ** -0.5
    return q, l2_normalize(k), v, g, beta


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token. q/k [B, T, Hk, dk], v [B, T, Hv, dv], g/beta [B, T, Hv], state
    [B, Hv, dk, dv] (fp32) → (out [B, T, Hv, dv] in v's dtype, final state fp32)."""
    out_dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    state = state.float()
    outs = []
    for t in range(q.shape[2]):
        state = state * g[:, :, t].exp()[..., None, None]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k[:, :, t])
        update = (v[:, :, t] - predicted) * beta[:, :, t, None]
        state = state + k[:, :, t, :, None] * update[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, :, t]))
    out = torch.stack(outs, dim=2).transpose(1, 2).to(out_dtype)
    return out, state


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    block: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block by block, same arguments and result as `recurrent_gated_delta_rule`.

    Inside a block of C tokens with cumulative log-decay c_t (c_t = g_1 + ... + g_t) and
    decay D[t, s] = exp(c_t - c_s) for s <= t, the corrections u solve the unit lower
    triangular system (I + A) u = beta * v - beta * exp(c) * (k S0), with
    A[t, s] = beta_t D[t, s] (k_t . k_s) for s < t. Then
    o_t = exp(c_t) q_t S0 + sum_{s<=t} D[t, s] (q_t . k_s) u_s and
    S = exp(c_C) S0 + sum_s exp(c_C - c_s) k_s u_s^T.
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    state = state.float()
    length = q.shape[2]
    outs = []
    for start in range(0, length, block):
        end = min(start + block, length)
        qc, kc, vc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        bc = beta[:, :, start:end, None]
        cum = g[:, :, start:end].cumsum(-1)  # [B, H, C]
        size = end - start
        causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        log_decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf"))
        decay = log_decay.exp()  # [B, H, C, C], zero above the diagonal
        strict = (bc * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
        eye = torch.eye(size, dtype=q.dtype, device=q.device)
        rhs = bc * vc - (bc * cum.exp()[..., None] * kc) @ state
        u = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)
        attn = (qc @ kc.transpose(-1, -2)) * decay
        outs.append((cum.exp()[..., None] * qc) @ state + attn @ u)
        tail = (cum[..., -1:] - cum).exp()[..., None]  # decay from each token to block end
        state = cum[..., -1].exp()[..., None, None] * state + (tail * kc).transpose(-1, -2) @ u
    out = torch.cat(outs, dim=2).transpose(1, 2).to(out_dtype)
    return out, state


def causal_conv1d(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv then SiLU. x [T, C], conv_state [C, kernel - 1] (the previous
    inputs, zeros at a sequence's start), weight [C, kernel] → (out [T, C], new state)."""
    kernel = weight.shape[-1]
    history = torch.cat([conv_state.to(x.dtype), x.transpose(0, 1)], dim=-1)  # [C, W + T]
    length = x.shape[0]
    # A sum of `kernel` shifted products: torch's depthwise conv1d is far slower on the CPU
    # for these shapes (many channels, a few taps, few tokens).
    weight = weight.to(x.dtype)
    out = history[:, :length] * weight[:, :1]
    for tap in range(1, kernel):
        out = out + history[:, tap : tap + length] * weight[:, tap : tap + 1]
    return F.silu(out).transpose(0, 1), history[:, history.shape[-1] - (kernel - 1) :]
