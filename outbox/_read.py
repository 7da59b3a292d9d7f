"""Reading JSON the way the host reads it: every line pi prints, every answer, every row.

Two things a plain ``msgspec`` decode refuses that the host takes (issue 36):

- **Half a surrogate pair.** JavaScript writes a lone UTF-16 surrogate as ``\\ud83d`` (pi's
  grep tool cuts lines inside an emoji; the host stores such messages as sent). The host's
  own way round, ``host/_surrogates.py``, is reused here, never copied: a half pair the
  producer reads as text is U+FFFD, as where the host only looks (``read=True``). It is
  imported on the first line that needs it, so an app whose lines never do does not load
  the host's modules.
- **Deep nesting.** CPython's decoders recurse, within the 1,000 frames of its recursion
  limit, counted from wherever they are called: the host reads 979 levels where it decodes
  (``outbox._rows.MAX_DEPTH``), a caller deeper in its own stack fewer. :func:`deep` reads
  again on a new thread's stack what the caller's had no room for, so what is read never
  depends on where it is read from.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def read(decoder: msgspec.json.Decoder[T], data: bytes) -> T:
    """``decoder.decode(data)``; half surrogate pairs read as the host reads them (U+FFFD).

    Raises ``msgspec.DecodeError`` for text that is not JSON even so, and
    ``RecursionError`` for nesting deeper than this stack leaves room for (see :func:`deep`).
    """
    try:
        return decoder.decode(data)
    except msgspec.DecodeError:
        from host._surrogates import decode  # the host's reading, loaded when first needed

        return decode(decoder, data, read=True)


def deep(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``; run again on a new thread when the caller's stack is too deep for it.

    A new thread starts its count of frames afresh; its stack (CPython's for threads: 16 MiB
    on macOS, glibc's stack limit on Linux, 8 MiB by default) holds the 1,000 levels, which
    take some 450 KiB. It is joined at once: only a row nested hundreds of levels, read from
    deep in a stack, ever goes this way.
    Raises what ``fn`` raises there, ``RecursionError`` for nesting no stack here can read.
    """
    try:
        return fn(*args)
    except RecursionError:
        pass
    out: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            out.append((True, fn(*args)))
        except BaseException as exc:  # handed to the caller, which raises it
            out.append((False, exc))

    thread = threading.Thread(target=run, name="outbox-deep-read", daemon=True)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    result: T = value
    return result
