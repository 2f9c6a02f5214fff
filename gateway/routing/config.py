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

import yaml

from gateway.routing.plugins import create_plugin
from gateway.routing.plugins.base import Filter, Picker, Scorer

BUILTIN_POLICIES: dict[str, str] = {
    # Prefix reuse and load in one unit (see plugins/estimated_wait.py): additive scores
    # of prefix share and load sent every request sharing a system prompt to one pod.
    "prefix-aware": """
filters:
  - type: healthy
  - type: not-saturated
scorers:
  - {type: estimated-wait, weight: 1}
picker: {type: max-score}
""",
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


def _expect(plugin, kind: str, where: str):
    if plugin.kind != kind:
        raise ValueError(f"{where}: plugin {plugin.type!r} is a {plugin.kind}, not a {kind}")
    return plugin


def _entry(entry: object, where: str) -> tuple[str, dict]:
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ValueError(f"{where}: expected a mapping with a 'type', got {entry!r}")
    params = entry.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}: params must be a mapping, got {params!r}")
    return entry["type"], params


def parse_router_config(document: object) -> RouterConfig:
    """Build the chain from a parsed YAML document; ValueError names the bad entry."""
    if not isinstance(document, dict):
        raise ValueError(f"router config must be a mapping, got {type(document).__name__}")
    unknown = set(document) - {"filters", "scorers", "picker"}
    if unknown:
        raise ValueError(f"router config has unknown keys {sorted(unknown)}")
    filters = []
    for i, entry in enumerate(document.get("filters") or []):
        name, params = _entry(entry, f"filters[{i}]")
        filters.append(_expect(create_plugin(name, params), "filter", f"filters[{i}]"))
    scorers = []
    for i, entry in enumerate(document.get("scorers") or []):
        name, params = _entry(entry, f"scorers[{i}]")
        weight = entry.get("weight", 1.0)
        if not isinstance(weight, (int, float)) or weight < 0:
            raise ValueError(f"scorers[{i}]: weight must be a number >= 0, got {weight!r}")
        scorer = _expect(create_plugin(name, params), "scorer", f"scorers[{i}]")
        scorers.append((scorer, float(weight)))
    name, params = _entry(document.get("picker") or {"type": "max-score"}, "picker")
    picker = _expect(create_plugin(name, params), "picker", "picker")
    return RouterConfig(filters, scorers, picker)


def load_router_config(name_or_path: str) -> RouterConfig:
    """A built-in policy (`prefix-aware`, `round-robin`) or a YAML file's chain."""
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
