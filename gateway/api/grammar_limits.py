"""A cheap static check of a constraint's grammar before any pod compiles it.

A grammar's compile time grows with the repetition it spells out: a regex `[a-z]{1,20000}`
or a string's `maxLength: 20000` becomes thousands of grammar states, each masked against
the whole vocabulary. So every constraint (response_format, tools, guided_*) is read here,
without compiling, and refused with a 400 naming the limit when any of these is over it:

- one repetition bound: a regex or EBNF `{m,n}`, a JSON schema's min/maxLength,
  min/maxItems, min/maxProperties (`max_repeat`);
- the repetition nested inside other repetition: each bound times the bounds enclosing it,
  summed over the whole constraint (`max_total_repeat`);
- one enum's (or one regex alternation's) values (`max_enum`);
- the constraint's text (`max_bytes`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gateway.errors import bad_request
from iris.proto import common_pb2

_BOUND = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_SCHEMA_BOUNDS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_Kind = common_pb2.Constraint
MAX_GROUP_DEPTH = 64  # regex / EBNF groups inside groups (the walk recurses per level)


@dataclass(frozen=True)
class GrammarLimits:
    """The gateway's grammar limits (GatewaySettings.grammar_*)."""

    max_repeat: int = 1000
    max_total_repeat: int = 100_000
    max_enum: int = 1000
    max_bytes: int = 256 << 10

    @classmethod
    def of(cls, settings) -> GrammarLimits:
        return cls(
            settings.grammar_max_repeat,
            settings.grammar_max_total_repeat,
            settings.grammar_max_enum,
            settings.grammar_max_bytes,
        )


def check_grammar(constraint: common_pb2.Constraint | None, limits: GrammarLimits, param: str):
    """Raise a 400 naming `param` and the limit if the constraint's grammar is too large."""
    if constraint is None or constraint.kind == _Kind.JSON_OBJECT:
        return
    _Walk(limits, param).constraint(constraint)


class _Walk:
    def __init__(self, limits: GrammarLimits, param: str) -> None:
        self.limits = limits
        self.param = param
        self.total = 0
        self.ebnf = False

    def refuse(self, what: str, limit_name: str, limit: int):
        raise bad_request(
            f"{self.param}: {what}, over the limit {limit_name} = {limit}",
            self.param,
            "grammar_too_large",
        )

    def constraint(self, constraint: common_pb2.Constraint) -> None:
        size = len(constraint.value.encode())
        if size > self.limits.max_bytes:
            self.refuse(
                f"the constraint is {size} bytes", "grammar_max_bytes", self.limits.max_bytes
            )
        if constraint.kind in (_Kind.REGEX, _Kind.EBNF):
            self.text(constraint.value, 1, ebnf=constraint.kind == _Kind.EBNF)
            return
        try:
            document = json.loads(constraint.value)
        except (ValueError, RecursionError):
            return  # not JSON: the schema checks (or the pod) name that
        if constraint.kind == _Kind.STRUCTURAL_TAG:
            self.tag(document, 1)
        else:
            self.schema(document, 1)

    def bound(self, value, where: str, outer: int) -> int:
        """Count one repetition bound nested in `outer`; the product it makes."""
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON Schema counts 12000.0 as an integer
        if isinstance(value, bool) or not isinstance(value, int):
            return outer
        if value > self.limits.max_repeat:
            self.refuse(f"{where} = {value}", "grammar_max_repeat", self.limits.max_repeat)
        product = outer * max(value, 1)
        self.add(product)
        return product

    def enum(self, count: int, where: str) -> None:
        if count > self.limits.max_enum:
            self.refuse(f"{where} has {count} values", "grammar_max_enum", self.limits.max_enum)

    def schema(self, node, outer: int) -> None:
        if isinstance(node, list):
            for item in node:
                self.schema(item, outer)
            return
        if not isinstance(node, dict):
            return
        inner = outer
        for key in _SCHEMA_BOUNDS:
            if key in node:
                inner = max(inner, self.bound(node[key], key, outer))
        if isinstance(node.get("enum"), list):
            self.enum(len(node["enum"]), "enum")
        if isinstance(node.get("pattern"), str):
            self.text(node["pattern"], outer)
        for key, value in node.items():
            if key in ("enum", "const", "default", "examples", "pattern"):
                continue
            if isinstance(value, (dict, list)):
                # What an array's items or a string's characters repeat sits under its bound.
                self.schema(value, inner if key in ("items", "prefixItems", "contains") else outer)

    def tag(self, node, outer: int) -> None:
        """An xgrammar structural tag: its JSON schemas, regexes and grammars."""
        if isinstance(node, list):
            for item in node:
                self.tag(item, outer)
            return
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind == "json_schema" and "json_schema" in node:
            self.schema(node["json_schema"], outer)
        elif kind == "regex" and isinstance(node.get("pattern"), str):
            self.text(node["pattern"], outer)
        elif kind == "grammar" and isinstance(node.get("grammar"), str):
            self.text(node["grammar"], outer, ebnf=True)
        for key, value in node.items():
            if key != "json_schema" and isinstance(value, (dict, list)):
                self.tag(value, outer)

    def text(self, text: str, outer: int, ebnf: bool = False) -> None:
        """A regex or EBNF: each `{m,n}` times the bounds of the groups around it; the
        alternatives of one group counted against max_enum. (Quoted strings are literals
        only in EBNF; in a regex a quote is just a character.)"""
        self.ebnf = ebnf
        _, weight = self.sequence(text, 0, 0)
        self.add(outer * weight)

    def sequence(self, text: str, i: int, depth: int) -> tuple[int, int]:
        """(where the group that starts at `i` ends, the repetition inside it: each bound
        times the bounds around it, relative to the group)."""
        weight, alternatives = 0, 1
        while i < len(text):
            char = text[i]
            if char == "\\":
                i += 2
            elif char == "[":
                i = _class_end(text, i)
            elif self.ebnf and char in "\"'":
                i = _string_end(text, i)
            elif char == ")" and depth:
                return i + 1, weight
            elif char == "(":
                if depth >= MAX_GROUP_DEPTH:
                    self.refuse(
                        f"groups nest deeper than {MAX_GROUP_DEPTH}",
                        "group depth",
                        MAX_GROUP_DEPTH,
                    )
                i, inner = self.sequence(text, i + 1, depth + 1)
                number, i = self.quantifier(text, i)
                weight += number * (1 + inner) if number else inner
            elif char == "|":
                alternatives += 1
                self.enum(alternatives, "an alternation")
                i += 1
            else:
                number, i = self.quantifier(text, i) if char == "{" else (0, i + 1)
                weight += number
        return i, weight

    def quantifier(self, text: str, i: int) -> tuple[int, int]:
        """(the bound of a `{m,n}` at `i`, checked, or 0; where it ends)."""
        match = _BOUND.match(text, i)
        if not match:
            return 0, i + (1 if i < len(text) and text[i] == "{" else 0)
        low, high = match.group(1), match.group(2)
        number = int(high) if high else int(low)
        if number > self.limits.max_repeat:
            self.refuse(
                f"the repetition {match.group(0)} = {number}",
                "grammar_max_repeat",
                self.limits.max_repeat,
            )
        return max(number, 1), match.end()

    def add(self, weight: int) -> None:
        self.total += weight
        if self.total > self.limits.max_total_repeat:
            self.refuse(
                f"its repetition bounds, nested and summed, come to {self.total}",
                "grammar_max_total_repeat",
                self.limits.max_total_repeat,
            )


def _class_end(text: str, start: int) -> int:
    i = start + 1
    if i < len(text) and text[i] == "^":
        i += 1
    if i < len(text) and text[i] == "]":
        i += 1
    while i < len(text) and text[i] != "]":
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _string_end(text: str, start: int) -> int:
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1
