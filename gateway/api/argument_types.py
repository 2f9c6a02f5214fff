"""One argument of a text-format tool call (a Qwen XML `<parameter=P>` block, whose value is
bare text) as the value the tool's schema gives it (docs/design/gateway.md, tools).

The rule, for every text-format parser: a `$ref` is resolved within the tool schema's
`$defs`; the text is parsed as JSON only when the parameter's schema allows a type other
than string and the parsed value validates against it, the non-string branches of `anyOf`,
`oneOf` or a `type` list tried in order; otherwise the value is the text itself. An `enum`
of strings without a `type` is a string; a parameter the schema does not declare stays a
string. So `Optional[str]` (`anyOf: [string, null]`, what pydantic writes) keeps `12345`
and `true` as the text the model wrote.
"""

from __future__ import annotations

from typing import Any

from iris.models.tool_format import parsed_arguments

MAX_REF_HOPS = 32  # a $ref chain longer than this (or a cycle) resolves to nothing
_DEFINITIONS = ("$defs", "definitions")


def argument_value(text: str, schema: Any, root: dict) -> Any:
    """`text` typed by the parameter's `schema` (None: undeclared) inside the tool's
    parameters schema `root`."""
    branches = non_string_branches(schema, root)
    if not branches:
        return text
    value = parsed_arguments(text)
    if value is text or isinstance(value, str):  # not JSON, or a JSON string: the text
        return text
    for branch in branches:
        if _valid(value, branch, root):
            return value
    return text


def non_string_branches(schema: Any, root: dict, depth: int = 0) -> list[Any]:
    """The parts of `schema` that allow a value other than a string, in order (empty: a
    string only)."""
    schema = resolved(schema, root)
    if schema is True:
        return [schema]
    if not isinstance(schema, dict) or depth > MAX_REF_HOPS:
        return []
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [
                branch
                for part in schema[key]
                for branch in non_string_branches(part, root, depth + 1)
            ]
    kind = schema.get("type")
    if isinstance(kind, str):
        return [] if kind == "string" else [schema]
    if isinstance(kind, list):
        return [{**schema, "type": each} for each in kind if each != "string"]
    if "enum" in schema:
        values = schema["enum"] if isinstance(schema["enum"], list) else []
        return [] if all(isinstance(each, str) for each in values) else [schema]
    if "const" in schema:
        return [] if isinstance(schema["const"], str) else [schema]
    return [schema]  # no type told: any JSON value


def resolved(schema: Any, root: dict) -> Any:
    """`schema` with a `$ref` into `root`'s `$defs` (or `definitions`) followed; None
    when it names nothing there."""
    for _ in range(MAX_REF_HOPS):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            return schema
        prefix, _, name = schema["$ref"].rpartition("/")
        table = (
            root.get(prefix.removeprefix("#/")) if prefix in ("#/$defs", "#/definitions") else None
        )
        schema = table.get(name) if isinstance(table, dict) else None
    return None


def _valid(value: Any, branch: Any, root: dict) -> bool:
    """Whether `value` validates against `branch` (its `$ref`s into `root` resolved)."""
    from jsonschema import validators

    document = branch
    if isinstance(branch, dict):
        document = {**branch}
        for key in _DEFINITIONS:
            if isinstance(root.get(key), dict):
                document.setdefault(key, root[key])
    try:
        validator = validators.validator_for(document, default=validators.Draft202012Validator)
        return validator(document).is_valid(value)
    except Exception:  # a schema jsonschema cannot use (an unresolvable $ref...): not valid
        return False
