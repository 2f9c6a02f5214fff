"""`response_format`, `logit_bias` and JSON schemas: checked here (a clear 400 naming the
field), carried to the pod as a Constraint that it compiles (docs/design/gateway.md,
"Structured output and tools"). Nothing here compiles a grammar: the pod does, once per
distinct schema."""

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


@dataclass(frozen=True)
class RequestConstraint:
    """What a request's output must match: the constraint (None: free text), the JSON
    schema when it is one (tools combine it with their calls), and the request field it
    came from (for errors)."""

    constraint: common_pb2.Constraint | None = None
    schema: dict | None = None
    param: str | None = None


_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_STRUCTURED_OUTPUTS = {"json": "guided_json", "regex": "guided_regex", "choice": "guided_choice"}


def request_constraint(body, limits: SchemaLimits) -> RequestConstraint:
    """THE one place a request's output constraint is made: `response_format`, vLLM's
    `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, and vLLM's newer
    `structured_outputs` ({json | regex | choice | grammar}) all become one internal
    `Constraint` here (at most one of them may be set: two are a 400 naming both). A check
    that must apply to every constraint (a grammar's size, say) belongs here."""
    fields = {name: getattr(body, name, None) for name in _GUIDED}
    fields["response_format"] = body.response_format
    outputs = getattr(body, "structured_outputs", None)
    if outputs is not None:
        fields.update(_structured_outputs(outputs))
    given = [name for name, value in fields.items() if value is not None]
    if not given:
        return RequestConstraint()
    if len(given) > 1:
        raise bad_request(
            f"{given[0]} and {given[1]} both constrain the output: send one", given[1]
        )
    (param,) = given
    value = fields[param]
    if param == "response_format":
        constraint, schema = response_constraint(value, limits)
        return RequestConstraint(constraint, schema, param if constraint else None)
    if param.endswith("guided_json") or param.endswith(".json"):
        if isinstance(value, str):
            value = _json_text(value, param)
        text = checked_schema(value, param, limits)
        constraint = common_pb2.Constraint(kind=common_pb2.Constraint.JSON_SCHEMA, value=text)
        return RequestConstraint(constraint, value, param)
    if param.endswith("guided_regex") or param.endswith(".regex"):
        kind = common_pb2.Constraint.REGEX
        return RequestConstraint(common_pb2.Constraint(kind=kind, value=value), None, param)
    if param.endswith("guided_choice") or param.endswith(".choice"):
        grammar = "root ::= " + " | ".join(_ebnf_literal(choice) for choice in value)
        kind = common_pb2.Constraint.EBNF
        return RequestConstraint(common_pb2.Constraint(kind=kind, value=grammar), None, param)
    kind = common_pb2.Constraint.EBNF  # guided_grammar: xgrammar's EBNF, root rule `root`
    return RequestConstraint(common_pb2.Constraint(kind=kind, value=value), None, param)


def _structured_outputs(outputs) -> dict:
    """vLLM's `structured_outputs` object as the guided_* field it stands for, checked the
    same way (the params name `structured_outputs.<key>`)."""
    if not isinstance(outputs, dict):
        raise bad_request("structured_outputs must be an object", "structured_outputs")
    found = {}
    for key, value in outputs.items():
        if value is None:
            continue
        param = f"structured_outputs.{key}"
        if key == "json":
            found[param] = value
        elif key in ("regex", "grammar"):
            if not isinstance(value, str) or not value or len(value) > 64 * 1024:
                raise bad_request(f"{param} must be a non-empty string of at most 65536", param)
            found[param] = value
        elif key == "choice":
            if (
                not isinstance(value, list)
                or not 1 <= len(value) <= 256
                or not all(isinstance(c, str) and 0 < len(c) <= 1024 for c in value)
            ):
                raise bad_request(
                    f"{param} must be 1 to 256 non-empty strings of at most 1024 characters",
                    param,
                )
            found[param] = value
        else:
            raise bad_request(
                f"{param} is not supported: use json, regex, choice or grammar", param
            )
    return found


def _json_text(text: str, param: str) -> dict:
    """A schema sent as a JSON string (vLLM accepts both)."""
    if len(text) > 1 << 20:
        raise bad_request(f"{param} is over {1 << 20} characters", param, "schema_too_large")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise bad_request(f"{param} is not valid JSON", param, "invalid_schema") from None


def _ebnf_literal(text: str) -> str:
    """`text` as an EBNF string literal: quotes, backslashes and control characters escaped."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
