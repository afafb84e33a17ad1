"""The contract of one decoded JSON record, checked by every reader: field types (:func:`validate_record`, with
``list[X]``, ``dict[str, X]``, ``Optional`` and :class:`FiniteNumber`), text that is valid Unicode
(:func:`check_unicode`), and :class:`DataError`, whose message names the file, the line and the field.

Apart from :mod:`repair.data` (the files themselves: JSONL and JSON IO, BEIR folders, T0) so each module stays one
room; :mod:`repair.data` re-exports these names, and the stages import them from there.
"""

from __future__ import annotations

import json
import math
import re
import typing
from typing import Any


class DataError(ValueError):
    """A malformed input file; the message names the file, the line (when there is one) and the field."""


class FiniteNumber:
    """Schema type of a JSON number that must be finite: Python's json reads ``NaN`` and ``Infinity``, and a score
    that is NaN compares false with everything (issue 44: 09b copied, and 10 accepted, any list as scores)."""


def _type_name(tp: Any) -> str:
    if tp is FiniteNumber:
        return "finite number"
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    if isinstance(tp, tuple):
        return " or ".join(_type_name(t) for t in tp)
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    """isinstance with ``list[X]``/``dict[str, X]`` generics; ints are accepted where floats are expected."""
    if tp is Any:
        return True
    if isinstance(tp, tuple):
        return any(_matches(value, t) for t in tp)
    if tp is FiniteNumber:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        return any(_matches(value, t) for t in typing.get_args(tp))
    if origin in (list, tuple):
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        _, item = typing.get_args(tp)
        return isinstance(value, dict) and all(_matches(v, item) for v in value.values())
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def validate_record(record: Any, where: str, required: dict[str, Any] | None = None,
                    optional: dict[str, Any] | None = None) -> dict:
    """Check one decoded JSON object against field types; raise :class:`DataError` naming ``where`` and field."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    required, optional = required or {}, optional or {}
    for name, tp in [*required.items(), *optional.items()]:  # an optional field may be absent or null
        if name not in record and name in required:
            raise DataError(f"{where}: missing field '{name}'")
        value = record.get(name)
        if name in record and (value is not None or name in required) and not _matches(value, tp):
            raise DataError(f"{where}: field '{name}' must be {_type_name(tp)}, got {type(value).__name__}: "
                            f"{str(value)[:80]!r}")
    return record


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any, field: str = "") -> tuple[str, str] | None:
    """(field, the surrogate written as ``\\ud800``) of the first string in a decoded JSON value that holds a lone
    UTF-16 surrogate, or None; the field as ``query`` or ``negative_candidates[0].abstract``. JSON can write one
    (``"\\ud800"``) though no UTF-8 text can hold it: it decodes to a Python str that fails only when a tokenizer or
    a writer encodes it, far from the file and line (issue 44)."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        return (field, f"\\u{ord(found.group()):04x}") if found else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        name = f"{field}[{key}]" if isinstance(key, int) else f"{field}.{key}" if field else key
        found = lone_surrogate(key, name) if isinstance(key, str) else None
        found = found or lone_surrogate(item, name)
        if found:
            return found
    return None


def check_unicode(record: Any, where: str, line: str) -> None:
    """Refuse a record decoded from ``line`` whose text holds a lone surrogate (:class:`DataError` naming ``where``
    and the field). Only a ``\\u`` escape can make one (the line was read as UTF-8), so most lines cost one search."""
    found = lone_surrogate(record) if "\\u" in line else None
    if found:
        field, escape = found
        raise DataError(f"{where}: {f'field {field!r}' if field else 'the line'} is not valid Unicode text: it holds "
                        f"{escape}, half of a UTF-16 surrogate pair")


def json_error(where: str, exc: json.JSONDecodeError) -> DataError:
    """``where: invalid JSON (<reason> at column N)``; json's reasons that end in "at" do not give "at at column"."""
    reason = exc.msg.removesuffix(" at")
    return DataError(f"{where}: invalid JSON ({reason} at column {exc.colno})")
