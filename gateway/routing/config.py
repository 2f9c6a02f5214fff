"""The routing chain from YAML: a built-in policy name or a file.

filters:
  - type: healthy
  - type: not-saturated
    params: {max_waiting: 64}
scorers:
  - {type: prefix, weight: 3}
  - {type: kv-utilisation, weight: 1}
picker: {type: max-score}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from gateway.routing.plugins import create_plugin
from gateway.routing.plugins.base import Filter, Picker, Scorer
from iris.settings import validation_message


def _one_scorer(scorer: str) -> str:
    return f"""
filters:
  - type: healthy
  - type: not-saturated
scorers:
  - {{type: {scorer}, weight: 1}}
picker: {{type: max-score}}
"""


# The default scorer of `prefix-aware` (docs/design/gateway.md, "Routing": which, and why).
DEFAULT_PREFIX_SCORER = "estimated-ttft"

BUILTIN_POLICIES: dict[str, str] = {
    # Prefix reuse and load in one unit (see plugins/estimated_wait.py, estimated_ttft.py):
    # additive scores of prefix share and load sent every request sharing a system prompt
    # to one pod. `estimated-wait` counts prompt tokens, `estimated-ttft` seconds, with
    # loads from the host tier and the KV store priced apart from prefill.
    "prefix-aware": _one_scorer(DEFAULT_PREFIX_SCORER),
    "estimated-wait": _one_scorer("estimated-wait"),
    "estimated-ttft": _one_scorer("estimated-ttft"),
    "round-robin": """
filters:
  - type: healthy
  - type: not-saturated
picker: {type: round-robin}
""",
}


@dataclass
class RouterConfig:
    filters: list[Filter]
    scorers: list[tuple[Scorer, float]]
    picker: Picker


class _Plugin(BaseModel):
    """One plugin entry of the YAML: its `type` and its factory's `params`."""

    model_config = ConfigDict(extra="forbid")

    type: StrictStr
    params: dict[str, Any] | None = None


class _Scorer(_Plugin):
    weight: float = Field(1.0, ge=0, strict=True)


class RouterDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filters: list[_Plugin] | None = None
    scorers: list[_Scorer] | None = None
    picker: _Plugin | None = None


def _build(entry: _Plugin, kind: str, where: str):
    try:
        plugin = create_plugin(entry.type, entry.params)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    if plugin.kind != kind:
        raise ValueError(f"{where}: plugin {plugin.type!r} is a {plugin.kind}, not a {kind}")
    return plugin


def parse_router_config(document: object) -> RouterConfig:
    """Build the chain from a parsed YAML document; ValueError names the bad entry."""
    try:
        parsed = RouterDocument.model_validate(document)
    except ValidationError as err:
        raise ValueError(f"invalid router config: {validation_message(err, 'router')}") from None
    filters = [
        _build(entry, "filter", f"filters[{i}]") for i, entry in enumerate(parsed.filters or [])
    ]
    scorers = [
        (_build(entry, "scorer", f"scorers[{i}]"), entry.weight)
        for i, entry in enumerate(parsed.scorers or [])
    ]
    picker = _build(parsed.picker or _Plugin(type="max-score"), "picker", "picker")
    return RouterConfig(filters, scorers, picker)


def load_router_config(name_or_path: str) -> RouterConfig:
    """A built-in policy (`prefix-aware`, `estimated-wait`, `estimated-ttft`,
    `round-robin`) or a YAML file's chain."""
    text = BUILTIN_POLICIES.get(name_or_path)
    if text is None:
        path = Path(name_or_path)
        if not path.is_file():
            known = ", ".join(sorted(BUILTIN_POLICIES))
            raise ValueError(
                f"router config {name_or_path!r} is neither a built-in policy ({known}) nor a file"
            )
        text = path.read_text()
    return parse_router_config(yaml.safe_load(text))
