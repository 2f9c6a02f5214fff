"""Device check of fla-core's gated delta rule kernels (the `cuda` extra) as Iris calls them
(llm_svc/engine/models/gated_deltanet.py `fla_kernels`) against Iris's torch forms, on a
CUDA GPU. It has NOT yet run (docs/status.md): no GPU was at hand, and fla's
`chunk_gated_delta_rule` does not run under TRITON_INTERPRET=1.

What is known without a GPU: the adapter's arguments, driven through a per-token statement
of fla 0.6's documented contract, give the torch forms' results (tests/llm_svc/
test_gdn_kernels.py); and fla 0.6.0's own torch references (`naive_recurrent_gated_delta_rule`,
`naive_chunk_gated_delta_rule`, read from its wheel in a throwaway directory) agree with the
torch forms within 5e-7 on expanded, normalised inputs (a one-off check, not in the suite).

This script checks:
1. chunked parity: several prefills packed in one varlen call (`cu_seqlens`; lengths of
   1, 37, 64, 200 and 513 tokens, so single tokens, partial and many 64-token blocks), each
   from a random initial state, at Qwen3.5-like shapes per rank (16 key / 32 value heads of
   128, and the TP 2 half), in float32 and bfloat16: outputs and final states within
   TOLERANCE of their largest magnitude;
2. recurrent parity: one token each of 8 sequences (decode) the same way;
3. with `--model DIR` (a Qwen3.5 checkpoint; `iris models make-tiny --arch qwen3_5` makes a
   tiny one; `--model tiny` builds the tests' own), the engine's greedy tokens with
   `linear_attention_kernels` "fla" equal "torch".

Run: `python bench/gdn_device_check.py` (exit status 0 = every check held).
`--self-test` runs the same comparisons on the CPU with the torch forms on both sides
(how the script itself was tried; it shows nothing about fla).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOLERANCE = {"float32": 2e-3, "bfloat16": 3e-2}
PREFILLS = [1, 37, 64, 200, 513]
DECODES = 8
SHAPES = [(16, 32, 128, 128), (8, 16, 128, 128)]  # (key heads, value heads, dk, dv)


def _inputs(lens, heads, dtype, device, seed):
    import torch
    import torch.nn.functional as F

    hk, hv, dk, dv = heads
    gen = torch.Generator(device="cpu").manual_seed(seed)
    total = sum(lens)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    q, k = rand(1, total, hk, dk).to(dtype), rand(1, total, hk, dk).to(dtype)
    v = rand(1, total, hv, dv).to(dtype)
    g = -F.softplus(rand(1, total, hv))  # log-decays, fp32 as the model computes them
    beta = torch.sigmoid(rand(1, total, hv)).to(dtype)
    states = rand(len(lens), hv, dk, dv) * 0.1
    return q, k, v, g, beta, states


def _gap(got, want) -> float:
    """Largest difference relative to the reference's largest magnitude."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def _rule_checks(candidate, reference, device: str, dtypes) -> bool:
    import torch

    passed = True
    for heads in SHAPES:
        for name in dtypes:
            dtype = getattr(torch, name)
            q, k, v, g, beta, states = _inputs(PREFILLS, heads, dtype, device, seed=0)
            got = candidate.chunk(q, k, v, g, beta, states, PREFILLS)
            want = reference.chunk(q, k, v, g, beta, states, PREFILLS)
            gaps = [_gap(got[0], want[0]), _gap(got[1], want[1])]
            q, k, v, g, beta, states = _inputs([1] * DECODES, heads, dtype, device, seed=1)
            decode = [x.transpose(0, 1) for x in (q, k, v, g, beta)]
            got = candidate.recurrent(*decode, states)
            want = reference.recurrent(*decode, states)
            gaps += [_gap(got[0], want[0]), _gap(got[1], want[1])]
            ok = max(gaps) <= TOLERANCE[name]
            passed &= ok
            print(
                f"heads {heads} {name}: chunk out {gaps[0]:.1e} state {gaps[1]:.1e}, "
                f"recurrent out {gaps[2]:.1e} state {gaps[3]:.1e}: {'ok' if ok else 'FAIL'}"
            )
    return passed


def _engine_check(model_dir: str, device: str) -> bool:
    from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams

    prompts = ["The capital of France is Paris. A cat sat on the mat;", "hello world, how are"]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    tokens = {}
    for kernels in ("torch", "fla"):
        config = EngineConfig(
            model_dir, device=device, dtype="float32", linear_attention_kernels=kernels,
            max_num_batched_tokens=32, num_pages=256, page_size=16,
        )  # fmt: skip
        engine = LLMEngine(config)
        for index, text in enumerate(prompts):
            engine.add_request(str(index), engine.tokenizer(text)["input_ids"], params)
        got: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step():
                got.setdefault(out.request_id, []).extend(out.new_token_ids)
        engine.close()
        tokens[kernels] = got
    ok = tokens["torch"] == tokens["fla"]
    print(f"engine greedy tokens, fla vs torch: {'equal' if ok else 'DIFFER'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda"])
    parser.add_argument(
        "--model", help="a Qwen3.5 checkpoint for the engine check ('tiny': the test one)"
    )
    parser.add_argument("--self-test", action="store_true", help="torch vs torch on the CPU")
    args = parser.parse_args()
    from llm_svc.engine.models.gated_deltanet import TORCH, fla_kernels

    if args.self_test:
        return 0 if _rule_checks(TORCH, TORCH, "cpu", ["float32"]) else 1
    passed = _rule_checks(fla_kernels(), TORCH, args.device, ["float32", "bfloat16"])
    if args.model == "tiny":
        from tests.llm_svc.checkpoints import tiny_checkpoint

        args.model = str(tiny_checkpoint("qwen3_5"))
    if args.model:
        passed &= _engine_check(args.model, args.device)
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
