"""`tools`, `tool_choice`, `parallel_tool_calls` and `response_format` of a chat request →
what the pod is asked to do (`OutputPlan`): which tools the prompt shows, which constraint
the output must follow, whether tool calls are parsed out of the answer.

tool_choice: "none" (tools are not shown, nothing is parsed), "auto" (the default with
tools: shown, and calls in the answer are parsed), "required" or a named function (a call
is forced through a grammar: xgrammar's structural tag of the model's call format)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gateway.api.structured import SCHEMA_NAME, SchemaLimits, checked_schema, request_constraint
from gateway.errors import bad_request
from iris.models.tool_format import ToolCallFormat
from iris.proto import common_pb2

_NO_PARAMETERS = {"type": "object", "properties": {}}
# Blanks allowed in a row inside forced JSON: room for a model's usual spacing, and no way
# to run on in whitespace until max_tokens.
MAX_WHITESPACE = 2


@dataclass
class OutputPlan:
    """`tools` go to the chat template; `constraint` to the pod, named `constraint_param`
    in its errors; `parse_tools`: the answer's tool calls are parsed (names: those allowed)."""

    tools: list[dict] | None = None
    constraint: common_pb2.Constraint | None = None
    constraint_param: str | None = None
    parse_tools: bool = False
    tool_names: set[str] = field(default_factory=set)

    @property
    def tool_parameters(self) -> dict[str, dict]:
        """Each tool's parameter schema, by name (the Qwen XML parser reads the types)."""
        return {
            tool["function"]["name"]: tool["function"]["parameters"] for tool in self.tools or []
        }


def checked_tools(tools, limits: SchemaLimits, max_tools: int) -> list[dict]:
    """The tools as OpenAI function tools, each checked; their parameters default to an
    empty object schema."""
    if not isinstance(tools, list) or not tools:
        raise bad_request("tools must be a non-empty list of function tools", "tools")
    if len(tools) > max_tools:
        raise bad_request(f"tools has {len(tools)} entries, over the limit of {max_tools}", "tools")
    checked, names = [], set()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request(f"{where} must be an object with type 'function'", f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not SCHEMA_NAME.match(name):
            raise bad_request(
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-' (got {name!r})",
                f"{where}.function.name",
            )
        if name in names:
            raise bad_request(
                f"{where}.function.name {name!r} is listed twice", f"{where}.function.name"
            )
        names.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(
                f"{where}.function.description must be a string", f"{where}.function.description"
            )
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(
                f"{where}.function.strict must be a boolean", f"{where}.function.strict"
            )
        parameters = function.get("parameters", _NO_PARAMETERS)
        checked_schema(parameters, f"{where}.function.parameters", limits)
        entry = {"name": name, "parameters": parameters}
        if description:
            entry["description"] = description
        checked.append({"type": "function", "function": entry})
    return checked


def forced_name(tool_choice, names: set[str]) -> str | None:
    """The function a `{"type": "function", "function": {"name"}}` choice names."""
    function = tool_choice.get("function") if tool_choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise bad_request(
            "tool_choice must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in names:
        raise bad_request(
            f"tool_choice names function {name!r}, which is not in tools", "tool_choice"
        )
    return name


def plan_chat_output(body, limits: SchemaLimits, max_tools: int, fmt: ToolCallFormat) -> OutputPlan:
    """The plan for a chat request; a 400 naming the field for anything malformed."""
    wanted = request_constraint(body, limits)
    response, response_schema = wanted.constraint, wanted.schema
    choice, tools = body.tool_choice, body.tools
    if body.parallel_tool_calls is not None and not isinstance(body.parallel_tool_calls, bool):
        raise bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    parallel = body.parallel_tool_calls is not False
    if tools is None:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return OutputPlan(constraint=response, constraint_param=wanted.param)
    tools = checked_tools(tools, limits, max_tools)
    names = {tool["function"]["name"] for tool in tools}
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        name = forced_name(choice, names)
        forced = [tool for tool in tools if tool["function"]["name"] == name]
        tag = calls_format(forced, fmt, parallel=False)
        return _forced(tools, tag, {name})
    if choice == "none":
        return OutputPlan(constraint=response, constraint_param=wanted.param)
    if choice == "required":
        return _forced(tools, calls_format(tools, fmt, parallel), names)
    if choice != "auto":
        raise bad_request(
            f"tool_choice = {choice!r} is not one of 'none', 'auto', 'required' or a "
            "named function",
            "tool_choice",
        )
    constraint, param = None, None
    if response is not None:
        if response_schema is None:
            raise bad_request(
                f"{wanted.param} cannot be combined with tools (only a JSON schema can)",
                wanted.param,
            )
        # The answer is either the requested JSON or tool calls.
        content = _json_format(response_schema)
        tag = {"type": "or", "elements": [content, calls_format(tools, fmt, parallel)]}
        constraint, param = _tag_constraint(tag), wanted.param
    return OutputPlan(tools, constraint, param, parse_tools=True, tool_names=names)


def _forced(tools: list[dict], tag: dict, names: set[str]) -> OutputPlan:
    return OutputPlan(tools, _tag_constraint(tag), "tools", parse_tools=True, tool_names=names)


def _tag_constraint(fmt: dict) -> common_pb2.Constraint:
    text = json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)
    return common_pb2.Constraint(kind=common_pb2.Constraint.STRUCTURAL_TAG, value=text)


def calls_format(tools: list[dict], fmt: ToolCallFormat, parallel: bool) -> dict:
    """A structural-tag format for one call to any of `tools` (or, with `parallel`, one or
    more separated by the format's separator), written the model family's way; a list
    format (Mistral) puts its marker and brackets around them."""
    tags = [_call_tag(tool["function"], fmt) for tool in tools]
    one = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
    calls = one
    if parallel:
        more = {
            "type": "sequence",
            "elements": [{"type": "const_string", "value": fmt.separator}, one],
        }
        calls = {"type": "sequence", "elements": [one, {"type": "star", "content": more}]}
    if not fmt.is_list:
        return calls
    return {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": fmt.list_begin},
            calls,
            {"type": "const_string", "value": fmt.list_end},
        ],
    }


def _call_tag(function: dict, fmt: ToolCallFormat) -> dict:
    if fmt.style == "qwen_xml":
        # xgrammar's qwen_xml style writes the `<parameter=...>` blocks of the schema.
        return {
            "type": "tag",
            "begin": f"{fmt.call_begin}<function={function['name']}>\n",
            "content": {**_json_format(function["parameters"]), "style": "qwen_xml"},
            "end": f"</function>{fmt.call_end}",
        }
    name = json.dumps(function["name"], ensure_ascii=False)
    return {
        "type": "tag",
        "begin": f'{fmt.call_begin}{{"name": {name}, "arguments": ',
        "content": _json_format(function["parameters"]),
        "end": f"}}{fmt.call_end}",
    }


def _json_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_WHITESPACE}
