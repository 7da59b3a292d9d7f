"""docs/protocol.schema.json is generated from the wire types, must not go stale, and must be
plain JSON Schema that generators read as it is.

That json-schema-to-typescript and quicktype turn it into types that compile under
``tsc --strict`` (and refuse what they should) is checked by
clients/typescript/test/schema.test.ts, which ``make test`` runs when Node is there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from host import _errors
from host._messages import Head
from host._wire import MAX_LINE, METHODS, PROTOCOL_VERSION
from scripts.gen_schema import OUT, ROOT_TITLE, render

# The keywords of JSON Schema draft 2020-12 this document may use at its top level.
TOP_LEVEL = {"$schema", "title", "description", "type", "properties", "required"}
TOP_LEVEL |= {"additionalProperties", "$defs"}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(OUT.read_text(encoding="utf-8"))
    return loaded


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "$ref":
                yield v.removeprefix("#/$defs/")
            else:
                yield from _refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v)


def _def(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The definition a ``$ref`` (or an ``allOf`` of one) points at."""
    if "allOf" in schema:
        (schema,) = schema["allOf"]
    found: dict[str, Any] = doc["$defs"][schema["$ref"].removeprefix("#/$defs/")]
    return found


def test_schema_file_is_up_to_date() -> None:
    assert OUT.read_text(encoding="utf-8") == render(), (
        "docs/protocol.schema.json is stale: run `make schema`"
    )


def test_the_root_is_plain_schema_with_a_name_that_outlives_the_version(
    doc: dict[str, Any],
) -> None:
    assert set(doc) <= TOP_LEVEL, f"not JSON Schema keywords: {set(doc) - TOP_LEVEL}"
    assert doc["title"] == ROOT_TITLE == "HostcoreProtocol"
    assert str(PROTOCOL_VERSION) not in doc["title"]
    assert doc["properties"]["protocolVersion"]["const"] == PROTOCOL_VERSION
    assert doc["properties"]["maxLineBytes"]["const"] == MAX_LINE


def test_every_definition_is_reachable_from_the_root(doc: dict[str, Any]) -> None:
    """json-schema-to-typescript drops unreachable definitions unless told otherwise."""
    seen: set[str] = set()
    todo = list(_refs(doc["properties"]))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += _refs(doc["$defs"][name])
    assert set(doc["$defs"]) == seen, f"unreachable: {set(doc['$defs']) - seen}"
    for name, schema in doc["$defs"].items():
        assert schema.get("title", name) == name  # generators name types by title


def test_methods_map_every_method_to_its_params_and_result(doc: dict[str, Any]) -> None:
    methods = doc["$defs"]["Methods"]["properties"]
    assert set(methods) == {*METHODS, "$/cancelRequest"}
    assert set(doc["$defs"]["Methods"]["required"]) == set(methods)
    for name, (params, result) in METHODS.items():
        entry = methods[name]
        assert entry["required"] == ["params", "result"]
        for typ, part in ((params, "params"), (result, "result")):
            schema = _def(doc, entry["properties"][part])
            props = schema.get("properties", {})
            wire = {f.encode_name for f in msgspec.structs.fields(typ)}
            assert wire == set(props), f"{name} {part}: {wire ^ set(props)}"
    assert methods["$/cancelRequest"]["properties"]["result"] == {"type": "null"}


def test_results_are_closed_and_params_refuse_unknown_fields(doc: dict[str, Any]) -> None:
    for name in METHODS:
        entry = doc["$defs"]["Methods"]["properties"][name]["properties"]
        assert _def(doc, entry["params"])["additionalProperties"] is False, name
        assert _def(doc, entry["result"])["additionalProperties"] is False, name
    for name, schema in doc["$defs"].items():
        if name in {"SessionSummary", "RecoveredRow", "RevisionInfo", "Pager"}:
            assert schema["additionalProperties"] is False, name


def test_params_without_fields_accept_only_an_empty_object(doc: dict[str, Any]) -> None:
    """`{}` as a TypeScript type accepts any value but null: the schema must say more."""
    empty = doc["$defs"]["EmptyParams"]
    assert empty["properties"] == {}
    assert empty["additionalProperties"] is False
    assert empty["patternProperties"] == {"": False}


def test_a_message_types_the_fields_the_host_owns(doc: dict[str, Any]) -> None:
    message = doc["$defs"]["Message"]
    head = {f.encode_name for f in msgspec.structs.fields(Head)}
    assert head <= set(message["properties"])
    assert message["required"] == ["id", "role"]
    assert message["additionalProperties"] is True  # the caller's own fields
    assert _def(doc, message["properties"]["role"])["enum"] == [
        "user",
        "assistant",
        "tool",
        "system",
    ]
    assert _def(doc, message["properties"]["status"])["enum"] == ["complete", "aborted", "error"]
    assert doc["$defs"]["AppendParams"]["properties"]["message"] == {"$ref": "#/$defs/Message"}
    got = doc["$defs"]["GetResult"]["properties"]["messages"]
    assert got["items"] == {"$ref": "#/$defs/Message"}


def test_ids_carry_their_pattern_in_ecma_dialect(doc: dict[str, Any]) -> None:
    pattern = doc["$defs"]["Id"]["pattern"]
    assert "\\Z" not in pattern  # JSON Schema patterns are ECMA-262: "$" ends the input
    ok = re.compile(pattern.replace("$", "\\Z"))
    assert ok.match("session-1") and not ok.match("../x") and not ok.match("..")
    params = doc["$defs"]["SessionParams"]["properties"]
    assert params["sessionId"] == {"$ref": "#/$defs/Id"}
    assert doc["$defs"]["GetParams"]["properties"]["limit"]["minimum"] == 0
    assert doc["$defs"]["GetParams"]["properties"]["displayCap"]["minimum"] == 1


def test_every_error_has_its_own_object_with_typed_data(doc: dict[str, Any]) -> None:
    variants = [_def(doc, v) for v in doc["$defs"]["ErrorObject"]["anyOf"]]
    by_code = {v["properties"]["code"]["const"]: v for v in variants}
    classes = [c for c in _errors.HostError.__subclasses__() if c.__module__ == _errors.__name__]
    assert set(by_code) == {c.code for c in classes}
    for cls in classes:
        data = _def(doc, by_code[cls.code]["properties"]["data"])
        assert data["properties"]["code"] == {"const": cls.name}
        assert data["additionalProperties"] is False
        extra = {f.encode_name for f in msgspec.structs.fields(cls.data_type)}
        assert set(data["properties"]) == {"code", *extra}, cls.name
    not_found = _def(doc, by_code[-32004]["properties"]["data"])
    assert sorted(not_found["properties"]["kind"]["enum"]) == [
        "message",
        "revision",
        "session",
        "turn",
    ]


def test_the_json_rpc_envelopes_are_there(doc: dict[str, Any]) -> None:
    defs = doc["$defs"]
    requests = [_def(doc, r) for r in defs["Request"]["anyOf"]]
    assert {r["properties"]["method"]["const"] for r in requests} == {*METHODS, "$/cancelRequest"}
    for r in requests:
        assert r["properties"]["jsonrpc"] == {"const": "2.0"}
    assert [r["$ref"] for r in defs["Response"]["anyOf"]] == [
        "#/$defs/SuccessResponse",
        "#/$defs/ErrorResponse",
    ]
    assert defs["ErrorResponse"]["properties"]["error"] == {"$ref": "#/$defs/ErrorObject"}
