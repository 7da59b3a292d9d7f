"""``docs/protocol.md`` is generated from the wire types; it must be current and complete."""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import msgspec
import msgspec.inspect as mi
import pytest

from host import _errors
from host._wire import METHODS, CancelParams

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
GENERATOR = ROOT / "scripts" / "gen_protocol_doc.py"
REGENERATE = "run `.venv/bin/python scripts/gen_protocol_doc.py` and commit docs/protocol.md"

ALL_METHODS: dict[str, tuple[type[msgspec.Struct], type[msgspec.Struct] | None]] = {
    **METHODS,
    "$/cancelRequest": (CancelParams, None),
}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protocol_doc", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def doc() -> str:
    assert DOC.exists(), f"docs/protocol.md is missing: {REGENERATE}"
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def sections(doc: str) -> dict[str, str]:
    """Each method's section (from its ``### `name``` heading to the next heading)."""
    out: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in doc.splitlines():
        if line.startswith(("## ", "### ")):
            if name is not None:
                out[name] = "\n".join(lines)
            name, lines = None, []
            if line.startswith("### `") and line.endswith("`"):
                name = line[len("### `") : -1]
            continue
        lines.append(line)
    if name is not None:
        out[name] = "\n".join(lines)
    return out


def _fields(cls: type[msgspec.Struct]) -> Iterator[tuple[str, str]]:
    """Yield ``(struct name, wire name)`` of every field of ``cls`` and the Structs it nests."""
    seen: set[type[msgspec.Struct]] = set()
    todo = [cls]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        info = mi.type_info(current)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            yield current.__name__, f.encode_name
            todo += _nested(f.type)


def _nested(t: mi.Type) -> list[type[msgspec.Struct]]:
    match t:
        case mi.StructType():
            return [t.cls]
        case mi.ListType():
            return _nested(t.item_type)
        case mi.DictType():
            return _nested(t.value_type)
        case mi.UnionType():
            return [c for member in t.types for c in _nested(member)]
    return []


def test_doc_is_current(doc: str) -> None:
    """The file on disk is exactly what the generator makes from today's code."""
    fresh = _generator().render()
    if doc != fresh:
        diff = difflib.unified_diff(
            doc.splitlines(), fresh.splitlines(), "docs/protocol.md", "generated", lineterm=""
        )
        shown = "\n".join(list(diff)[:60])
        pytest.fail(f"docs/protocol.md is stale: {REGENERATE}\n{shown}")


@pytest.mark.parametrize("method", list(ALL_METHODS))
def test_every_method_and_field_is_documented(method: str, sections: dict[str, str]) -> None:
    assert method in sections, f"no `### `{method}`` section in docs/protocol.md: {REGENERATE}"
    text = sections[method]
    params, result = ALL_METHODS[method]
    for cls in (params, result):
        if cls is None:
            continue
        assert f"(`{cls.__name__}`)" in text, f"{method}: {cls.__name__} is not documented"
        for owner, field in _fields(cls):
            assert f"| `{field}` |" in text, f"{method}: field {owner}.{field} is not documented"


def test_every_error_is_documented(doc: str) -> None:
    for cls in _errors.HostError.__subclasses__():
        row = f"| {cls.code} | `{cls.name}` | `{cls.__name__}` |"
        assert row in doc, f"error {cls.name} ({cls.code}) is not in the errors table"


def test_departures_are_documented(doc: str) -> None:
    assert "## Departures from and additions to PROTOCOL.md" in doc
    assert "safe only for a caller that owns the whole transcript" in doc
