"""The field's load generators, aiperf and guidellm, as bench/third_party.py runs them: their
command lines, a run that is always stopped, and their own figures read back from the
files they export. Both live in .venv-bench (scripts/bench_clients.sh), never in .venv:
aiperf brings its own torch.

Facts about the clients this rests on (aiperf 0.13.0, guidellm 0.8.1, read from their
`--help` and exports):

- aiperf: `profile --endpoint-type chat --streaming` with synthetic images
  (`--image-source noise`: every image new, so nothing can be reused; `assets`: its 4
  built-in pictures; a directory: a chosen pool), and `--custom-dataset-type multi_turn
  --input-file F`: JSONL sessions of turns whose `image` is a local file, sent as a data
  URL, each turn resending the session's history. Its figures are in
  `ARTIFACT_DIR/profile_export_aiperf.json` (`time_to_first_token`, `inter_token_latency`:
  avg / p50 / p90 ... in ms; `output_token_throughput`, `request_throughput`: avg). A
  local tokenizer directory must be given without HF_HUB_OFFLINE (offline, aiperf takes
  it for a Hub id).
- guidellm: `run --scenario FILE` with a JSON spec (backend, profile, data, constraints,
  outputs); the `sweep` profile runs synchronous, then throughput, then constant rates
  between them. Its health check asks `/health` (Iris answers `/healthz`: routed there).
  Its figures per benchmark are in the JSON output's `benchmarks[].metrics`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.trace import Conversation, image_table

ROOT = Path(__file__).resolve().parents[1]
BENCH_VENV = ROOT / ".venv-bench"


@dataclass(frozen=True)
class Figures:
    """One client run's own figures (ms, tokens/s, requests/s; NaN: not reported)."""

    requests: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    itl_p50_ms: float
    output_tok_s: float
    requests_s: float
    label: str = ""


def client_path(name: str) -> Path:
    """The client's executable in .venv-bench; FileNotFoundError naming the script."""
    path = BENCH_VENV / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `bash scripts/bench_clients.sh` first")
    return path


def run_client(argv: list[str], log: Path, timeout_s: float) -> None:
    """Run a client to its end, its output to `log`; on any exit from here (an error, a
    timeout, Ctrl-C) its whole process group is stopped first: aiperf starts services of
    its own, and none may outlive the benchmark."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env["TOKENIZERS_PARALLELISM"] = "false"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        child = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = child.wait(timeout=timeout_s)
        finally:
            if child.poll() is None:
                _stop_group(child)
    if code != 0:
        tail = log.read_text().splitlines()[-15:]
        raise RuntimeError(f"{argv[0]} exited with {code}; log {log}:\n" + "\n".join(tail))


def _stop_group(child: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


# --- aiperf ------------------------------------------------------------------------------


def aiperf_argv(
    url: str, model: str, tokenizer: Path, out_dir: Path, *, requests: int, concurrency: int,
    max_tokens: int, noise_size: tuple[int, int] | None = None, sessions: Path | None = None,
    prompt_tokens: int = 64,
) -> list[str]:  # fmt: skip
    """`aiperf profile` streaming chat against `url`: synthetic noise images of
    `noise_size` with prompts of `prompt_tokens`, or the multi-turn sessions in
    `sessions` (aiperf's multi_turn JSONL)."""
    argv = [
        str(client_path("aiperf")), "profile",
        "--model", model, "--url", url, "--endpoint-type", "chat", "--streaming",
        "--tokenizer", str(tokenizer), "--request-count", str(requests),
        "--concurrency", str(concurrency), "--artifact-dir", str(out_dir),
        "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry", "--random-seed", "1",
    ]  # fmt: skip
    if sessions is not None:
        argv += ["--custom-dataset-type", "multi_turn", "--input-file", str(sessions)]
        argv += ["--dataset-sampling-strategy", "sequential"]
    else:
        width, height = noise_size or (256, 256)
        argv += ["--image-source", "noise", "--image-batch-size", "1"]
        argv += ["--image-width-mean", str(width), "--image-height-mean", str(height)]
        argv += ["--isl", str(prompt_tokens), "--osl", str(max_tokens)]
        # One more new picture first, unmeasured: a fresh platform's first request pays its
        # first-call costs. (Not for sessions: it would send a session's turn early.)
        argv += ["--warmup-request-count", "1"]
    return argv


def aiperf_figures(out_dir: Path, label: str = "") -> Figures:
    """aiperf's own figures from its JSON export."""
    data = json.loads((out_dir / "profile_export_aiperf.json").read_text())

    def stat(name: str, key: str) -> float:
        return float((data.get(name) or {}).get(key, float("nan")))

    return Figures(
        requests=int(stat("request_count", "avg")),
        ttft_p50_ms=stat("time_to_first_token", "p50"),
        ttft_p90_ms=stat("time_to_first_token", "p90"),
        itl_p50_ms=stat("inter_token_latency", "p50"),
        output_tok_s=stat("output_token_throughput", "avg"),
        requests_s=stat("request_throughput", "avg"),
        label=label,
    )


def write_sessions(conversations: list[Conversation], folder: Path) -> Path:
    """aiperf's multi_turn JSONL for these conversations, their images written once each
    to `folder` (the same file, the same bytes, each time a turn attaches it). aiperf has
    no system role in this format: the system prompt leads the first turn's text."""
    folder.mkdir(parents=True, exist_ok=True)
    turns = [turn for conversation in conversations for turn in conversation.turns]
    paths = {}
    for key, png in image_table(turns, folder).items():
        paths[key] = folder / f"image-{len(paths)}.png"
        paths[key].write_bytes(png)
    lines = []
    for conversation in conversations:
        session = []
        for turn in conversation.turns:
            text = turn.text if turn.system is None else f"{turn.system}\n\n{turn.text}"
            entry: dict = {"text": text, "output_length": turn.max_tokens}
            if turn.images:
                entry["images"] = [str(paths[image.key]) for image in turn.images]
            session.append(entry)
        lines.append(json.dumps({"session_id": conversation.name, "turns": session}))
    sessions = folder / "sessions.jsonl"
    sessions.write_text("\n".join(lines) + "\n")
    return sessions


# --- guidellm ----------------------------------------------------------------------------


def guidellm_scenario(
    url: str, model: str, tokenizer: Path, output: Path, *, sweep_size: int,
    requests_per_rate: int, prompt_tokens: int, max_tokens: int,
) -> dict:  # fmt: skip
    """guidellm's rate sweep on streaming chat (text; see the module docstring)."""
    return {
        "spec": {
            "backend": {
                "kind": "openai_http", "target": url, "model": model,
                "request_format": "/v1/chat/completions", "api_routes": {"/health": "healthz"},
            },
            "profile": {"kind": "sweep", "sweep_size": sweep_size},
            "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
            "data": [
                {"kind": "synthetic_text", "prompt_tokens": prompt_tokens,
                 "output_tokens": max_tokens},
            ],
            "constraints": [{"kind": "max_requests", "count": requests_per_rate}],
            "outputs": [{"kind": "json", "path": str(output)}],
        }
    }  # fmt: skip


def guidellm_argv(scenario: Path) -> list[str]:
    return [
        str(client_path("guidellm")), "run", "--scenario", str(scenario),
        "--disable-console-interactive",
    ]  # fmt: skip


def guidellm_figures(output: Path) -> list[Figures]:
    """Per benchmark of the sweep (synchronous, throughput, constant@rate), its figures."""
    data = json.loads(output.read_text())
    found = []
    for benchmark in data["benchmarks"]:
        strategy, metrics = benchmark["config"]["strategy"], benchmark["metrics"]
        label = strategy["type_"]
        if "rate" in strategy:
            label += f"@{strategy['rate']:.2f}/s"

        def ok(name: str, metrics: dict = metrics) -> dict:
            return metrics[name]["successful"]

        found.append(
            Figures(
                requests=int(metrics["request_totals"]["successful"]),
                ttft_p50_ms=ok("time_to_first_token_ms")["median"],
                ttft_p90_ms=ok("time_to_first_token_ms")["percentiles"]["p90"],
                itl_p50_ms=ok("inter_token_latency_ms")["median"],
                output_tok_s=ok("output_tokens_per_second")["mean"],
                requests_s=ok("requests_per_second")["mean"],
                label=label,
            )
        )
    return found
