"""``sessions/<id>.meta.json``: a session's title, creation time and ``meta`` (the app's
object), the truth a rebuilt index takes them from. Written whole and replaced atomically
by ``session.create``, ``session.fork`` and ``session.update``; read by them, by the
start's recovery and by the start's reload of rows marked ``meta_dirty``.

A file this host did not write (an older host's, a hand's) is read leniently: what is not
of its type is left out, as is a ``meta`` past its bound, and a ``createdAt`` that is not
a timestamp is replaced, so no value of it can fail an index write or make a list page or
cursor outgrow its bound.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import Raw, Struct

from host._fs import read_regular
from host._index import MetaRow, now_iso
from host._surrogates import decode
from host._wire import ENCODER, MAX_META


class MetaFile(Struct, omit_defaults=True):
    """What ``meta.json`` holds."""

    title: str | None = None
    createdAt: str | None = None
    meta: dict[str, Raw] | None = None

    def row(self, session_id: str) -> MetaRow:
        """Its title and ``meta`` as the index keeps them."""
        return MetaRow.of(session_id, self.title, self.meta)


_NULL = Raw(b"null")


class _Loose(Struct):
    title: Raw = _NULL
    createdAt: Raw = _NULL
    meta: Raw = _NULL


def _field(decoder: msgspec.json.Decoder[Any], raw: Raw) -> Any:
    """One field of the file, or ``None`` when it is not of its type."""
    try:
        return decode(decoder, raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


_LOOSE = msgspec.json.Decoder(_Loose)
_TEXT = msgspec.json.Decoder(str | None)
_OBJECT = msgspec.json.Decoder(dict[str, Raw] | None)
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")


def encode(meta: MetaFile) -> bytes:
    return ENCODER.encode(meta)


def read_meta(path: str) -> tuple[bytes | None, MetaFile]:
    """The file's bytes (``None`` when there is none) and what it says."""
    try:
        data = read_regular(path)
    except OSError:
        return None, MetaFile()
    try:
        loose = decode(_LOOSE, data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return data, MetaFile()
    created = _field(_TEXT, loose.createdAt)
    return data, MetaFile(
        title=_field(_TEXT, loose.title),
        createdAt=created if created is not None and _TIMESTAMP.fullmatch(created) else None,
        meta=_field(_OBJECT, loose.meta) if len(loose.meta) <= MAX_META else None,
    )


def created_at(meta: MetaFile) -> str:
    """Its creation time, or now for a file that has none."""
    return meta.createdAt or now_iso()
