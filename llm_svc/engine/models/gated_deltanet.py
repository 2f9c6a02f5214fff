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

The engine calls the rule through `RuleKernels` over a step's packed sequences: `TORCH`
(these functions, a sequence at a time for prefill, every decode sequence at once) or, on
CUDA, fla-core's Triton kernels (`fla_kernels`: the optional `cuda` extra; one varlen call
for all prefills, one for all decodes). `choose_kernels` picks by device and setting.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


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


def causal_conv1d_step(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of N sequences (decode): x [N, C], conv_state [N, C, kernel - 1],
    weight [C, kernel] → (out [N, C], new states [N, C, kernel - 1]); as `causal_conv1d`."""
    history = torch.cat([conv_state.to(x.dtype), x[:, :, None]], dim=-1)  # [N, C, kernel]
    out = (history * weight.to(x.dtype)).sum(-1)
    return F.silu(out), history[:, :, 1:]


@dataclass(frozen=True)
class RuleKernels:
    """The gated delta rule over a step's sequences. `chunk(q, k, v, g, beta, states,
    lens)`: prefills packed one after another, q/k [1, T, Hk, dk], v [1, T, Hv, dv],
    g/beta [1, T, Hv] (g the log-decay, beta after its sigmoid), states [N, Hv, dk, dv]
    (fp32, [key, value] layout), `lens` the N lengths (host ints) summing to T.
    `recurrent(q, k, v, g, beta, states)`: one token of each of N sequences, q/k
    [N, 1, Hk, dk] and so on. Both take q/k before their L2 norm and scale, value head j
    reading key head j // (Hv / Hk), and return (out shaped as v, final states [N, Hv, dk,
    dv] fp32)."""

    name: str
    chunk: object
    recurrent: object


def _torch_chunk(q, k, v, g, beta, states, lens):
    outs, finals, start = [], [], 0
    for index, length in enumerate(lens):
        rows = slice(start, start + length)
        out, final = chunk_gated_delta_rule(
            q[:, rows], k[:, rows], v[:, rows], g[:, rows], beta[:, rows], states[index : index + 1]
        )
        outs.append(out)
        finals.append(final)
        start += length
    return torch.cat(outs, dim=1), torch.cat(finals)


def _torch_recurrent(q, k, v, g, beta, states):
    return recurrent_gated_delta_rule(q, k, v, g, beta, states)


TORCH = RuleKernels("torch", _torch_chunk, _torch_recurrent)

FLA_MISSING = (
    "the fla kernels need fla-core (flash-linear-attention), which is not installed: "
    "install Iris with its `cuda` extra, or set the linear-attention kernels to torch"
)


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None


def fla_arguments(q, k, v, g, beta, states) -> dict:
    """The keyword arguments of fla's `chunk_gated_delta_rule` and
    `fused_recurrent_gated_delta_rule` (fla-core 0.6) for the rule as `RuleKernels` states
    it: fla takes the same [B, T, heads, dim] layout and [N, Hv, K, V] states, shares key
    head j // (Hv / Hk) with value head j (its GVA), normalises q/k itself
    (`use_qk_l2norm_in_kernel`, x / sqrt(sum x^2 + 1e-6) as ours) and scales q by
    `scale` (ours: dk^-0.5); g is the log-decay (`use_gate_in_kernel` off) and beta is
    already through its sigmoid (`use_beta_sigmoid_in_kernel` off)."""
    return dict(
        q=q.contiguous(),
        k=k.contiguous(),
        v=v.contiguous(),
        g=g.float().contiguous(),
        beta=beta.contiguous(),
        scale=q.shape[-1] ** -0.5,
        initial_state=states.float().contiguous(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=False,
        use_beta_sigmoid_in_kernel=False,
        state_v_first=False,
    )


def fla_kernels(chunk=None, recurrent=None) -> RuleKernels:
    """fla-core's kernels (imported here: ModuleNotFoundError naming the extra when it is
    not installed); `chunk` / `recurrent` replace fla's functions, with their signatures
    (bench/gdn_device_check.py and the tests pass fla's own torch references)."""
    if chunk is None or recurrent is None:
        try:
            from fla.ops.gated_delta_rule import (
                chunk_gated_delta_rule as fla_chunk,
            )
            from fla.ops.gated_delta_rule import (
                fused_recurrent_gated_delta_rule as fla_recurrent,
            )
        except ImportError as err:
            raise ModuleNotFoundError(FLA_MISSING) from err
        chunk, recurrent = chunk or fla_chunk, recurrent or fla_recurrent

    def run_chunk(q, k, v, g, beta, states, lens):
        bounds = [0]
        for length in lens:
            bounds.append(bounds[-1] + length)
        bounds = torch.tensor(bounds, dtype=torch.long)
        out, final = chunk(
            **fla_arguments(q, k, v, g, beta, states),
            cu_seqlens=bounds.to(q.device),
            cu_seqlens_cpu=bounds,  # spares fla a device-to-host read of the lengths
        )
        return out.to(v.dtype), final.float()

    def run_recurrent(q, k, v, g, beta, states):
        out, final = recurrent(**fla_arguments(q, k, v, g, beta, states))
        return out.to(v.dtype), final.float()

    return RuleKernels("fla", run_chunk, run_recurrent)


KERNEL_CHOICES = ("auto", "torch", "fla")


def choose_kernels(setting: str, device: torch.device) -> RuleKernels:
    """`setting` "torch": always the torch forms; "fla": fla-core's kernels, on CUDA
    (ValueError on another device, ModuleNotFoundError without fla-core); "auto": fla's on
    CUDA when fla-core imports, else torch (with a warning on CUDA)."""
    if setting not in KERNEL_CHOICES:
        raise ValueError(f"linear_attention_kernels must be one of {KERNEL_CHOICES}, got {setting}")
    cuda = torch.device(device).type == "cuda"
    if setting == "torch":
        return TORCH
    if setting == "fla":
        if not cuda:
            raise ValueError(f"linear_attention_kernels fla runs on CUDA only, not on {device}")
        return fla_kernels()
    if not cuda:
        return TORCH
    if not fla_available():
        log.warning("fla-core is not installed: linear attention runs in torch on CUDA (slow)")
        return TORCH
    return fla_kernels()
