"""Generate docs/protocol.schema.json: a JSON Schema of every method's params and result.

Built from the msgspec types in host/_wire.py, so a client in another language can
generate its types from it. ``--check`` exits 1 when the file on disk is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from host._wire import METHODS, PROTOCOL_VERSION, CancelParams

OUT = Path(__file__).resolve().parent.parent / "docs" / "protocol.schema.json"


def build() -> dict[str, Any]:
    """Return the schema document."""
    names = sorted(METHODS)
    types: list[Any] = []
    for name in names:
        params, result = METHODS[name]
        types += [params, result]
    types.append(CancelParams)
    schemas, components = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    methods: dict[str, Any] = {}
    for i, name in enumerate(names):
        methods[name] = {"params": schemas[2 * i], "result": schemas[2 * i + 1]}
    methods["$/cancelRequest"] = {"params": schemas[-1], "result": {"type": "null"}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"hostcore wire protocol, version {PROTOCOL_VERSION}",
        "description": (
            "JSON-RPC 2.0 over NDJSON. `methods` maps each method to the schema of its params"
            " object and of its result; `$defs` holds the named types. Messages are opaque"
            " objects with `id` and `role`; see docs/protocol.md."
        ),
        "protocolVersion": PROTOCOL_VERSION,
        "methods": methods,
        "$defs": components,
    }


def _ecma(value: Any) -> Any:
    """Patterns in ECMA-262 dialect, as JSON Schema wants: Python's \\Z is ECMA's $."""
    if isinstance(value, dict):
        return {k: v.replace("\\Z", "$") if k == "pattern" else _ecma(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ecma(v) for v in value]
    return value


def render() -> str:
    return json.dumps(_ecma(build()), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the schema, or with ``--check`` fail when it is stale."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run `make schema`", file=sys.stderr)
            return 1
        print(f"{OUT} is up to date")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
