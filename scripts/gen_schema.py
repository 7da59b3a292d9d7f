"""Generate docs/protocol.schema.json: a JSON Schema (draft 2020-12) of the whole wire.

Built from the code's msgspec types (``host._wire.METHODS``, the message head
``host._messages.Head``, the error data of ``host/_errors.py``) with
``msgspec.json.schema_components``, then reshaped so that standard generators read it as
it is (``json-schema-to-typescript`` with no options, ``quicktype -s schema``):

- the root is an object with a fixed title, ``HostcoreProtocol``, whatever the version,
  whose properties name every wire type, so every definition is reachable from it;
- ``methods`` maps each method name to an object of its ``params`` and ``result``;
- a message is a ``Message``: the fields the host owns or reads are typed, every other
  field is the caller's (``additionalProperties``), where msgspec only sees ``Raw``;
- ids are one ``Id`` type with its pattern; roles and statuses are enums;
  ``protocolVersion`` is the constant 11; results are closed; a params object without
  fields accepts only ``{}``;
- the JSON-RPC request, response and error objects, with ``data`` typed per error code.

``--check`` exits 1 when the file on disk is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, get_args

import msgspec
import msgspec.inspect as mi

from host import _errors
from host._messages import PAGER_KEYS, Head, Role, Status
from host._wire import (
    ID_PATTERN,
    MAX_LINE,
    METHODS,
    PROTOCOL_VERSION,
    CancelParams,
    Event,
    Result,
    SessionEventParams,
    TurnEnd,
)

try:  # run as `python scripts/gen_schema.py` or imported as `scripts.gen_schema`
    from scripts.gen_protocol_doc import CANCEL_DOC, FIELD_NOTES, METHOD_DOCS, _subst
except ImportError:  # pragma: no cover - the script's own folder is on sys.path
    from gen_protocol_doc import CANCEL_DOC, FIELD_NOTES, METHOD_DOCS, _subst  # type: ignore

OUT = Path(__file__).resolve().parent.parent / "docs" / "protocol.schema.json"
ROOT_TITLE = "HostcoreProtocol"
CANCEL = "$/cancelRequest"
Schema = dict[str, Any]
StructType = type[msgspec.Struct]

ANY_JSON: Schema = {"type": ["string", "number", "boolean", "object", "array", "null"]}
"""Any JSON value. (A bare ``{}`` is the same, but one with a description is read as an
object by json-schema-to-typescript.)"""

ENUMS: dict[str, tuple[tuple[str, ...], str]] = {
    "Role": (get_args(Role), "Who a message is from."),
    "MessageStatus": (
        get_args(Status),
        "A stored message's status: `complete` (the default when absent), `aborted` (a"
        " reply cut short: a Stop, a crash, a promoted checkpoint) or `error`.",
    ),
    "TurnStatus": (get_args(TurnEnd), "How a turn ended."),
}


def ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def _noted(schema: Schema, note: str | None) -> Schema:
    """``schema`` with a description; a bare ``$ref`` is wrapped, so that generators do not
    copy the referenced type under a new name to carry it."""
    if not note:
        return schema
    if set(schema) == {"$ref"}:
        return {"allOf": [schema], "description": note}
    return {**schema, "description": note}


# -- what msgspec cannot see in the types ---------------------------------------------------

FIELD_TYPES: dict[tuple[str, str], Schema] = {
    ("HandshakeParams", "protocolVersion"): {"const": PROTOCOL_VERSION},
    ("HandshakeResult", "protocolVersion"): {"const": PROTOCOL_VERSION},
    ("DeleteResult", "deleted"): {"const": True},
    ("ShutdownResult", "shuttingDown"): {"const": True},
    ("EndTurnResult", "status"): ref("TurnStatus"),
    ("RecoveredRow", "status"): ref("MessageStatus"),
    ("RecoveredRow", "turnId"): {"anyOf": [ref("Id"), {"type": "null"}]},
    ("ProtocolMismatchData", "expected"): {"const": PROTOCOL_VERSION},
    ("ProtocolMismatchData", "got"): ANY_JSON,
    ("CancelParams", "id"): ref("RequestId"),
    ("PublishParams", "data"): ANY_JSON,
    ("LiveEvent", "data"): ANY_JSON,
}
"""Fields whose msgspec type is wider than what the host sends or accepts: the handshake's
version is decoded as any integer so that another one is PROTOCOL_MISMATCH, not
INVALID_PARAMS; statuses read from the index are plain strings in the code."""

RESULT_IDS = {"sessionId", "turnId", "messageId", "rootId"}
"""Fields of results and error data that hold an id (plain ``str`` there): typed ``Id``."""

MESSAGE_NOTES: dict[str, tuple[Schema, str]] = {
    "id": (ref("Id"), "The message's id, unique in its session."),
    "role": (ref("Role"), "Who the message is from."),
    "turnId": (
        {"anyOf": [ref("Id"), {"type": "null"}]},
        "The owning turn, written by the host from the call's `turnId` (else the"
        " message's own) and kept across every rewrite. Attribution only.",
    ),
    "status": (ref("MessageStatus"), "Absent means `complete`."),
    "capped": (
        {"type": "boolean"},
        "`true` only on a display-capped copy from `session.get`; writing such a copy back"
        " is `CONFLICT`.",
    ),
    "revisionRootId": (
        ref("Id"),
        "Regenerate pager, stamped on a user root by the host only; a caller's is dropped.",
    ),
    "revisionCount": (
        {"type": "integer", "minimum": 0},
        "Regenerate pager (host-owned): revisions of this root.",
    ),
    "activeRevision": (
        {"type": "integer", "minimum": 0},
        "Regenerate pager (host-owned): the revision shown.",
    ),
}
MESSAGE_DOC = (
    "A chat message. The host reads and owns only the fields typed here; every other field"
    " (`content`, timestamps, usage, ...) is the caller's and comes back as the caller's"
    " bytes. Pager fields a caller sends are dropped; the stored ones stay."
)
CONTENT_DOC = (
    "The caller's own content, any JSON value, returned unchanged. A checkpoint promoted"
    " without content (absent, empty string, empty list, only empty text blocks) is dropped."
)


def _doc(text: str) -> str:
    """Markdown prose of docs/protocol.md as a description: links become their text."""
    return re.sub(r"\[([^\]]+)\]\(#[^)]*\)", r"\1", _subst(text)).strip()


def _ecma(value: Any) -> Any:
    """Patterns in ECMA-262 dialect, as JSON Schema wants: Python's \\Z is ECMA's $."""
    if isinstance(value, dict):
        return {k: v.replace("\\Z", "$") if k == "pattern" else _ecma(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ecma(v) for v in value]
    return value


def _retype(value: Any) -> Any:
    """Inline ids and enums (as msgspec writes them) become references to their type."""
    if isinstance(value, list):
        return [_retype(v) for v in value]
    if not isinstance(value, dict):
        return value
    if value == {"type": "string", "pattern": ID_PATTERN}:
        return ref("Id")
    if set(value) == {"enum"}:
        for name, (members, _) in ENUMS.items():
            if sorted(value["enum"]) == sorted(members):
                return ref(name)
    return {k: _retype(v) for k, v in value.items()}


# -- the types msgspec renders --------------------------------------------------------------


def _structs() -> dict[str, StructType]:
    """Every Struct on the wire (params, results, what they nest), by name."""
    todo: list[StructType] = [c for pair in METHODS.values() for c in pair]
    todo += [CancelParams, Head, SessionEventParams, *(c.data_type for c in _error_classes())]
    found: dict[str, StructType] = {}
    while todo:
        cls = todo.pop()
        if cls.__name__ in found or cls is _errors.ErrorData:
            continue
        found[cls.__name__] = cls
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            todo += _nested_structs(f.type)
    return found


def _nested_structs(t: mi.Type) -> list[StructType]:
    match t:
        case mi.StructType():
            return [t.cls]
        case mi.ListType():
            return _nested_structs(t.item_type)
        case mi.DictType():
            return _nested_structs(t.value_type)
        case mi.UnionType():
            return [c for member in t.types for c in _nested_structs(member)]
    return []


def _is_raw(t: mi.Type) -> bool:
    if isinstance(t, mi.ListType):
        return _is_raw(t.item_type)
    if isinstance(t, mi.UnionType):
        return any(_is_raw(m) for m in t.types)
    return isinstance(t, mi.RawType)


def _struct_schema(cls: StructType, schema: Schema) -> Schema:
    """One Struct's schema: messages, overrides, ids and enums typed, notes, results closed."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    name = cls.__name__
    is_result = issubclass(cls, Result)
    host_made = is_result or issubclass(cls, (_errors.ErrorData, Event, SessionEventParams))
    props: Schema = {}
    if isinstance(tag := cls.__struct_config__.tag_field, str):  # an event's ``kind``
        props[tag] = schema["properties"][tag]
    for f in info.fields:
        prop = schema["properties"][f.encode_name]
        if (name, f.encode_name) in FIELD_TYPES:
            prop = FIELD_TYPES[name, f.encode_name]
        elif _is_raw(f.type):  # a message: the caller's bytes, typed by its head
            prop = {**prop, "items": ref("Message")} if "items" in prop else ref("Message")
        elif host_made and f.encode_name in RESULT_IDS and prop == {"type": "string"}:
            prop = ref("Id")
        # OpenAPI's discriminator is no JSON Schema keyword (ajv's strict mode refuses it):
        # each event's ``kind`` constant tells them apart anyway
        prop = _retype({k: v for k, v in prop.items() if k != "discriminator"})
        if is_result and prop.get("type") == "integer":
            prop = {**prop, "minimum": 0}  # lines, counts and revisions: never negative
        note = FIELD_NOTES.get((cls, f.encode_name))
        props[f.encode_name] = _noted(prop, _doc(note) if note else None)
    out: Schema = {**schema, "properties": props}
    if host_made:
        out["additionalProperties"] = False  # closed: a typo in a reader does not compile
    if not props and out.get("additionalProperties") is False:
        # `{}` in TypeScript accepts any non-null value; this accepts only an empty object.
        out["patternProperties"] = {"": False}
    return out


def _message(head: Schema) -> Schema:
    """The message type: ``Head``'s fields typed, the rest the caller's."""
    names = list(head["properties"])
    if set(names) - set(MESSAGE_NOTES) or set(PAGER_KEYS) - set(names):
        raise ValueError(f"Head's fields {names} are out of step with MESSAGE_NOTES")
    props = {name: _noted(*MESSAGE_NOTES[name]) for name in names}
    props["content"] = _noted(ANY_JSON, CONTENT_DOC)
    return {
        "title": "Message",
        "description": MESSAGE_DOC,
        "type": "object",
        "properties": props,
        "required": head["required"],
        "additionalProperties": True,
    }


# -- JSON-RPC -------------------------------------------------------------------------------


def _error_classes() -> list[type[_errors.HostError]]:
    return [c for c in _errors.HostError.__subclasses__() if c.__module__ == _errors.__name__]


def _error_title(cls: type[_errors.HostError]) -> str:
    return cls.__name__ if cls.__name__.endswith("Error") else cls.__name__ + "Error"


def _errors_defs(components: dict[str, Schema]) -> dict[str, Schema]:
    """One error object per code, its ``data`` typed; ``ErrorObject`` is their union."""
    defs: dict[str, Schema] = {}
    for cls in _error_classes():
        extra = components.get(cls.data_type.__name__, {"properties": {}, "required": []})
        data = f"{cls.__name__}Data"
        defs[data] = {
            "title": data,
            "description": f"`data` of `{cls.name}` ({cls.code}).",
            "type": "object",
            "properties": {"code": {"const": cls.name}, **extra["properties"]},
            "required": ["code", *extra.get("required", [])],
            "additionalProperties": False,
        }
        title = _error_title(cls)
        defs[title] = {
            "title": title,
            "description": " ".join((cls.__doc__ or "").split()).replace("``", "`"),
            "type": "object",
            "properties": {
                "code": {"const": cls.code},
                "message": {"type": "string", "description": "For people; may change."},
                "data": ref(data),
            },
            "required": ["code", "message", "data"],
            "additionalProperties": False,
        }
    defs["ErrorObject"] = {
        "title": "ErrorObject",
        "description": "A JSON-RPC error object; `data.code` is the stable name.",
        "anyOf": [ref(_error_title(c)) for c in _error_classes()],
    }
    return defs


def _pascal(method: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[./$]+", method) if p)


def _has_required(params: Schema) -> bool:
    return bool(params.get("required"))


def _envelope_defs(defs: dict[str, Schema]) -> dict[str, Schema]:
    """Requests (one per method, tagged by ``method``), notifications, responses."""
    out: dict[str, Schema] = {
        "RequestId": {
            "title": "RequestId",
            "description": "A request's id; the host answers with it (an integer is best).",
            "anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}],
        }
    }
    version = {"const": "2.0"}
    requests = []
    calls = [(n, p.__name__) for n, (p, _) in METHODS.items()]
    for name, params in [*calls, (CANCEL, CancelParams.__name__)]:
        title = "CancelRequest" if name == CANCEL else _pascal(name) + "Request"
        out[title] = {
            "title": title,
            "type": "object",
            "properties": {
                "jsonrpc": version,
                "id": ref("RequestId"),
                "method": {"const": name},
                "params": ref(params),
            },
            "required": ["jsonrpc", "id", "method"]
            + (["params"] if _has_required(defs[params]) else []),
            "additionalProperties": False,
        }
        requests.append(ref(title))
    out["Request"] = {
        "title": "Request",
        "description": "A call: one NDJSON line (or an element of a batch).",
        "anyOf": requests,
    }
    out["CancelNotification"] = {
        "title": "CancelNotification",
        "description": _doc(CANCEL_DOC),
        "type": "object",
        "properties": {
            "jsonrpc": version,
            "method": {"const": CANCEL},
            "params": ref(CancelParams.__name__),
        },
        "required": ["jsonrpc", "method", "params"],
        "additionalProperties": False,
    }
    out["SessionEventNotification"] = {
        "title": "SessionEventNotification",
        "description": "What the host sends a watching connection unasked, once per change"
        " (see `session.watch`; docs/protocol.md, Watching).",
        "type": "object",
        "properties": {
            "jsonrpc": version,
            "method": {"const": "session.event"},
            "params": ref(SessionEventParams.__name__),
        },
        "required": ["jsonrpc", "method", "params"],
        "additionalProperties": False,
    }
    out["Batch"] = {
        "title": "Batch",
        "description": "Several calls in one line; answered by one line, in order.",
        "type": "array",
        "items": {"anyOf": [ref("Request"), ref("CancelNotification")]},
        "minItems": 1,
    }
    out["SuccessResponse"] = {
        "title": "SuccessResponse",
        "type": "object",
        "properties": {
            "jsonrpc": version,
            "id": ref("RequestId"),
            "result": _noted(
                ANY_JSON, "The result of the method called: its type is `methods[method].result`."
            ),
        },
        "required": ["jsonrpc", "id", "result"],
        "additionalProperties": False,
    }
    out["ErrorResponse"] = {
        "title": "ErrorResponse",
        "type": "object",
        "properties": {
            "jsonrpc": version,
            "id": _noted(ref("RequestId"), "`null` when the request's id could not be read."),
            "error": ref("ErrorObject"),
        },
        "required": ["jsonrpc", "id", "error"],
        "additionalProperties": False,
    }
    out["Response"] = {
        "title": "Response",
        "description": "The answer to a request, matched by `id`; answers may come out of order.",
        "anyOf": [ref("SuccessResponse"), ref("ErrorResponse")],
    }
    out["BatchResponse"] = {
        "title": "BatchResponse",
        "type": "array",
        "items": ref("Response"),
    }
    return out


def _methods_def() -> Schema:
    entries: dict[str, Schema] = {}
    for name, (params, result) in METHODS.items():
        entries[name] = {
            "description": _doc(METHOD_DOCS[name]),
            "type": "object",
            "properties": {"params": ref(params.__name__), "result": ref(result.__name__)},
            "required": ["params", "result"],
            "additionalProperties": False,
        }
    entries[CANCEL] = {
        "description": _doc(CANCEL_DOC),
        "type": "object",
        "properties": {"params": ref(CancelParams.__name__), "result": {"type": "null"}},
        "required": ["params", "result"],
        "additionalProperties": False,
    }
    return {
        "title": "Methods",
        "description": "Every method: the type of its params and of its result.",
        "type": "object",
        "properties": entries,
        "required": list(entries),
        "additionalProperties": False,
    }


# -- the document ---------------------------------------------------------------------------


def build() -> Schema:
    """Return the schema document."""
    structs = _structs()
    wire = {(n, f.encode_name) for n, c in structs.items() for f in msgspec.structs.fields(c)}
    if stale := sorted(set(FIELD_TYPES) - wire):
        raise ValueError(f"FIELD_TYPES names fields that are not on the wire: {stale}")
    _, components = msgspec.json.schema_components(
        list(structs.values()), ref_template="#/$defs/{name}"
    )
    defs: dict[str, Schema] = {}
    for name, cls in structs.items():
        if name == Head.__name__:
            defs["Message"] = _message(components[name])
        elif not issubclass(cls, _errors.ErrorData):
            defs[name] = _struct_schema(cls, components[name])
    data = {
        n: _struct_schema(c, components[n])
        for n, c in structs.items()
        if issubclass(c, _errors.ErrorData)
    }
    defs.update(_errors_defs(data))
    defs["Id"] = {
        "title": "Id",
        "description": (
            "A session, turn, message or root id: 1 to 128 characters from `[A-Za-z0-9._:-]`,"
            " not `.` or `..`. Anything else is INVALID_PARAMS and never reaches the file"
            " system."
        ),
        "type": "string",
        "pattern": ID_PATTERN,
    }
    for name, (members, doc) in ENUMS.items():
        defs[name] = {"title": name, "description": doc, "enum": list(members)}
    defs["Methods"] = _methods_def()
    defs.update(_envelope_defs(defs))
    properties: Schema = {
        "protocolVersion": _noted(
            {"const": PROTOCOL_VERSION},
            "The protocol version: `handshake` must name exactly this one.",
        ),
        "maxLineBytes": _noted(
            {"const": MAX_LINE},
            "The longest request line the host reads (bytes, newline excluded); a longer"
            " one is answered LIMIT_EXCEEDED with `id: null`. Results are bounded the same.",
        ),
        "methods": ref("Methods"),
        "request": ref("Request"),
        "notification": ref("CancelNotification"),
        "event": ref("SessionEventNotification"),
        "batch": ref("Batch"),
        "response": ref("Response"),
        "batchResponse": ref("BatchResponse"),
        "error": ref("ErrorObject"),
        "message": ref("Message"),
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": ROOT_TITLE,
        "description": (
            "The hostcore wire protocol: JSON-RPC 2.0 over NDJSON (see docs/protocol.md). Not"
            " a value sent on the wire: a catalogue whose properties name every wire type."
            " `methods` maps each method to its params and result."
        ),
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        "$defs": dict(sorted(defs.items())),
    }


def render() -> str:
    return json.dumps(_ecma(build()), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the schema, or with ``--check`` fail when it is stale."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run `make schema`", file=sys.stderr)
            return 1
        print(f"{OUT} is up to date")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
