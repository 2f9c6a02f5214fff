"""Qwen3.5's MTP layer (llm_svc/engine/spec/mtp.py) reads the checkpoint's `mtp.*` as
intended: its forward over a prompt, then a chain of drafts each fed the layer's own
output, equals a plain reference written here from the raw safetensors with torch ops
(the layout: normed embedding and hidden state concatenated, `fc`, one gated-attention
decoder layer with a causal mask, `norm`, the target's LM head). And the engine feeds it
the right hidden states (spec/mtp_proposer.py): every chain it proposes equals the layer
run from scratch over transformers' last hidden states of the sequence."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from llm_svc.engine.models import load_model
from llm_svc.engine.spec import mtp_proposer
from llm_svc.engine.spec.mtp import DenseKV, load_mtp, mtp_layer_count
from tests.llm_svc.checkpoints import mtp_checkpoint
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids


def _norm(x, weight, eps):  # Qwen3.5's norms scale by (1 + weight)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + weight)


def _rope(x, positions, rotary, theta):
    half = rotary // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary, 2, dtype=torch.float32) / rotary)
    angles = positions[:, None].float() * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:rotary]
    turned = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    return torch.cat([turned, x[..., rotary:]], -1)


def _reference(w, config, hidden, embeds):
    """The MTP layer over positions 0..T-1 at once (every query sees keys 0..itself)."""
    eps, heads, kv_heads = config.rms_norm_eps, config.num_heads, config.num_kv_heads
    d, tokens = config.head_dim, hidden.shape[0]
    x = torch.cat([_norm(embeds, w["pre_fc_norm_embedding.weight"], eps),
                   _norm(hidden, w["pre_fc_norm_hidden.weight"], eps)], -1)  # fmt: skip
    x = x @ w["fc.weight"].T
    a = _norm(x, w["layers.0.input_layernorm.weight"], eps)
    q, gate = (a @ w["layers.0.self_attn.q_proj.weight"].T).view(tokens, heads, 2 * d).chunk(2, -1)
    k = (a @ w["layers.0.self_attn.k_proj.weight"].T).view(tokens, kv_heads, d)
    v = (a @ w["layers.0.self_attn.v_proj.weight"].T).view(tokens, kv_heads, d)
    q = _norm(q, w["layers.0.self_attn.q_norm.weight"], eps)
    k = _norm(k, w["layers.0.self_attn.k_norm.weight"], eps)
    positions = torch.arange(tokens)
    q = _rope(q, positions, config.rotary_dim, config.rope_theta)
    k = _rope(k, positions, config.rotary_dim, config.rope_theta)
    k = k.repeat_interleave(heads // kv_heads, 1)
    v = v.repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * d**-0.5
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(tokens, -1)
    gated = attn * torch.sigmoid(gate.reshape(tokens, -1))
    x = x + gated @ w["layers.0.self_attn.o_proj.weight"].T
    m = _norm(x, w["layers.0.post_attention_layernorm.weight"], eps)
    up = F.silu(m @ w["layers.0.mlp.gate_proj.weight"].T) * (m @ w["layers.0.mlp.up_proj.weight"].T)
    x = x + up @ w["layers.0.mlp.down_proj.weight"].T
    return _norm(x, w["norm.weight"], eps)


@torch.inference_mode()
def test_mtp_layer_equals_a_reference_from_the_raw_weights():
    model_dir = mtp_checkpoint("qwen3_5")
    assert mtp_layer_count(model_dir) == 1
    model, config = load_model(model_dir, torch.float32, torch.device("cpu"))
    layer = load_mtp(model_dir, config, torch.float32, torch.device("cpu"))
    raw = load_file(str(model_dir / "mtp.safetensors"))
    w = {name.removeprefix("mtp."): value.float() for name, value in raw.items()}
    target = load_file(str(model_dir / "model.safetensors"))
    embed, head = target["model.embed_tokens.weight"].float(), target["lm_head.weight"].float()

    generator = torch.Generator().manual_seed(0)
    prompt, chain = 6, 3
    hidden = torch.randn(prompt, config.hidden_size, generator=generator)
    tokens = torch.randint(0, config.vocab_size, (prompt,), generator=generator)
    # The module: the prompt's positions at once, then each draft from its own output.
    kv = DenseKV()
    out = layer(hidden, model.embed(tokens), torch.arange(prompt), kv)
    drafts, outs = [], [out]
    for step in range(chain):
        drafts.append(int(model.compute_logits(out[-1:]).argmax()))
        if step + 1 < chain:
            position = torch.tensor([prompt + step])
            out = layer(out[-1:], model.embed(torch.tensor(drafts[-1:])), position, kv)
            outs.append(out)
    # The reference: every position recomputed from scratch, the chain's inputs appended.
    ref_hidden, ref_tokens = hidden, tokens
    for step in range(chain):
        ref = _reference(w, config, ref_hidden, embed[ref_tokens])
        torch.testing.assert_close(outs[step], ref[-len(outs[step]) :], rtol=1e-4, atol=1e-4)
        assert int((ref[-1] @ head.T).argmax()) == drafts[step]
        ref_hidden = torch.cat([ref_hidden, ref[-1:]])
        ref_tokens = torch.cat([ref_tokens, torch.tensor(drafts[step : step + 1])])


def _chain(layer, model, hidden, tokens, k):
    """k drafts from scratch: the layer over positions 0..n-2 (hidden state i, token i + 1),
    then each draft from its own output."""
    kv, n = DenseKV(), len(tokens)
    out = layer(hidden, model.embed(torch.tensor(tokens[1:])), torch.arange(n - 1), kv)
    drafts = []
    for step in range(k):
        drafts.append(int(model.compute_logits(out[-1:]).argmax()))
        position = torch.tensor([n - 1 + step])
        out = layer(out[-1:], model.embed(torch.tensor(drafts[-1:])), position, kv)
    return drafts


@torch.inference_mode()
def test_engine_drafts_are_the_layer_over_the_target_hidden_states(monkeypatch):
    """One request through chunked prefill (chunks of 7, each run through the layer as it
    comes: CATCH_UP_ROWS lowered to 5) and verifications: every other
    step proposes the true continuation instead (all accepted: the verified rows' hidden
    states are kept), the others the layer's drafts (rejected: the hybrid state rolls back
    and the tokens are computed again). The layer's drafts at every step are its drafts
    over the target's hidden states of all the sequence's positions."""
    from transformers import Qwen3_5ForCausalLM

    monkeypatch.setattr(mtp_proposer, "CATCH_UP_ROWS", 5)
    model_dir = mtp_checkpoint("qwen3_5")
    prompt, new = list(range(10, 30)), 16
    args = dict(device="cpu", dtype="float32", max_num_batched_tokens=7)
    truth = token_ids(run_all(make_engine(model_dir, **args), {"r": (prompt, greedy(new))})["r"])
    engine = make_engine(
        model_dir, **args, num_speculative_tokens=3, speculative_method="mtp",
        speculative_min_acceptance=0.0,
    )  # fmt: skip
    proposer, seen = engine.speculator.proposer, []
    propose = proposer.propose

    def recording(seq, k):
        drafts = propose(seq, k)
        seen.append((list(seq.token_ids), k, drafts))
        done = seq.num_output_tokens
        return truth[done : done + k] if len(seen) % 2 else drafts

    proposer.propose = recording
    assert token_ids(run_all(engine, {"r": (prompt, greedy(new))})["r"]) == truth
    assert engine.stats().spec_accepted["mtp"] > 0 and len(seen) >= 4
    hf = Qwen3_5ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    for tokens, k, drafts in seen:
        hidden = hf.model(input_ids=torch.tensor([tokens[:-1]])).last_hidden_state[0]
        assert drafts == _chain(proposer.layer, proposer.target, hidden, tokens, k)
