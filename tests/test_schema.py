"""docs/protocol.schema.json is generated from the wire types and must not go stale."""

from __future__ import annotations

import json

import msgspec

from host._wire import METHODS
from scripts.gen_schema import OUT, render


def test_schema_file_is_up_to_date() -> None:
    assert OUT.read_text() == render(), "docs/protocol.schema.json is stale: run `make schema`"


def test_schema_covers_every_method_and_field() -> None:
    doc = json.loads(OUT.read_text())
    assert set(doc["methods"]) == {*METHODS, "$/cancelRequest"}
    for name, (params, result) in METHODS.items():
        for typ, part in ((params, "params"), (result, "result")):
            schema = doc["methods"][name][part]
            ref = schema["$ref"].rsplit("/", 1)[-1]
            props = doc["$defs"][ref].get("properties", {})
            wire = {f.encode_name for f in msgspec.structs.fields(typ)}
            assert wire == set(props), f"{name} {part}: {wire ^ set(props)}"


def test_session_ids_carry_their_pattern_in_ecma_dialect() -> None:
    import re

    doc = json.loads(OUT.read_text())
    pattern = doc["$defs"]["SessionParams"]["properties"]["sessionId"]["pattern"]
    assert "\\Z" not in pattern  # JSON Schema patterns are ECMA-262: "$" ends the input
    ok = re.compile(pattern.replace("$", "\\Z"))
    assert ok.match("session-1") and not ok.match("../x") and not ok.match("..")
