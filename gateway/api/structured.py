"""`response_format`, `logit_bias` and JSON schemas: checked here (a clear 400 naming the
field), carried to the pod as a Constraint that it compiles (docs/design.md, "Structured
output"). Nothing here compiles a grammar: the pod does, once per distinct schema."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from gateway.errors import APIError, bad_request
from iris.json_depth import json_depth
from iris.proto import common_pb2

MAX_LOGIT_BIAS = 300
LOGIT_BIAS_RANGE = 100.0
SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_CONSTRAINT_FIELD = "constraint="  # how the pod's errors about a constraint begin


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int
    max_depth: int

    @classmethod
    def of(cls, settings) -> SchemaLimits:
        """The gateway's limits (GatewaySettings.max_schema_bytes / max_schema_depth)."""
        return cls(settings.max_schema_bytes, settings.max_schema_depth)


def checked_schema(schema, param: str, limits: SchemaLimits) -> str:
    """A JSON schema's compact text, after its type, depth, size and meta-schema checks."""
    if not isinstance(schema, dict):
        raise bad_request(f"{param} must be a JSON object (a JSON Schema)", param)
    depth = json_depth(schema)
    if depth > limits.max_depth:
        raise bad_request(
            f"{param} nests {depth} levels deep, over the limit of {limits.max_depth}",
            param,
            "schema_too_deep",
        )
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode())
    if size > limits.max_bytes:
        raise bad_request(
            f"{param} is {size} bytes, over the limit of {limits.max_bytes}",
            param,
            "schema_too_large",
        )
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(
            schema
        )
    except exceptions.SchemaError as err:
        where = "/".join(str(part) for part in err.absolute_path) or "(root)"
        raise bad_request(
            f"{param} is not a valid JSON Schema at {where}: {err.message}", param, "invalid_schema"
        ) from None
    return text


def response_constraint(
    response_format, limits: SchemaLimits, param: str = "response_format"
) -> tuple[common_pb2.Constraint | None, dict | None]:
    """(the constraint, the parsed JSON schema if there is one) of a `response_format`:
    text → none; json_object → any object; json_schema → its schema."""
    if response_format is None:
        return None, None
    if not isinstance(response_format, dict):
        raise bad_request(f"{param} must be an object with a 'type'", param)
    kind = response_format.get("type")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return common_pb2.Constraint(kind=common_pb2.Constraint.JSON_OBJECT), {"type": "object"}
    if kind != "json_schema":
        raise bad_request(
            f"{param}.type = {kind!r} is not supported: use 'text', 'json_object' or 'json_schema'",
            f"{param}.type",
        )
    spec = response_format.get("json_schema")
    where = f"{param}.json_schema"
    if not isinstance(spec, dict):
        raise bad_request(f"{where} must be an object with 'name' and 'schema'", where)
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.match(name):
        raise bad_request(
            f"{where}.name must be 1-64 letters, digits, '_' or '-' (got {name!r})",
            f"{where}.name",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"{where}.strict must be a boolean", f"{where}.strict")
    schema = spec.get("schema")
    if schema is None:  # OpenAI allows leaving it out: any JSON object
        return common_pb2.Constraint(kind=common_pb2.Constraint.JSON_OBJECT), {"type": "object"}
    text = checked_schema(schema, f"{where}.schema", limits)
    return common_pb2.Constraint(kind=common_pb2.Constraint.JSON_SCHEMA, value=text), schema


def logit_bias(value, vocab_size: int) -> dict[int, float]:
    """OpenAI's `logit_bias` ({"token id": bias}) checked: at most 300 entries, ids inside
    the vocabulary, biases in [-100, 100]."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("logit_bias must be an object of token id -> bias", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise bad_request(
            f"logit_bias has {len(value)} entries, over the limit of {MAX_LOGIT_BIAS}",
            "logit_bias",
        )
    bias = {}
    for key, number in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if not 0 <= token < vocab_size or str(token) != str(key).strip():
            raise bad_request(
                f"logit_bias key {key!r} is not a token id in [0, {vocab_size})", "logit_bias"
            )
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float))
            or not math.isfinite(number)
            or not -LOGIT_BIAS_RANGE <= number <= LOGIT_BIAS_RANGE
        ):
            raise bad_request(
                f"logit_bias[{key!r}] = {number!r} must be a number in [-100, 100]", "logit_bias"
            )
        bias[token] = float(number)
    return bias


def name_constraint_error(err: APIError, param: str | None) -> APIError:
    """A pod's 400 about the constraint (it could not compile it, or not in time), named
    after the request field the constraint came from."""
    if param and err.status == 400 and err.message.startswith(_CONSTRAINT_FIELD):
        return bad_request(f"{param}: {err.message}", param, "invalid_schema")
    return err
