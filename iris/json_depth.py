"""How deeply a parsed JSON document nests: the gateway and the LLM pod bound a schema's
depth with it (a deep document must not exhaust the stack of whoever walks it)."""

from __future__ import annotations

from typing import Any


def json_depth(document: Any) -> int:
    """Nesting depth of a parsed JSON document (a scalar is 0), without recursion."""
    deepest, stack = 0, [(document, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return deepest
