"""The range of values jobsched stores: the same on every store.

Job parameters (user input) and run results and errors (task output) are JSON values, stored as
they are: JSON text in SQLite, BSON in MongoDB. BSON cannot hold every JSON value msgspec
accepts, and a value one store takes and the other refuses is a bug waiting for a migration.
So jobsched stores exactly the values both can hold, whichever store a deployment uses:

- integers from -2^63 to 2^63 - 1 (BSON's int64; JSON and msgspec allow any size);
- finite floats (JSON has no NaN or infinity);
- strings of Unicode text: no lone surrogates (UTF-8, hence JSON text and BSON, cannot encode
  them; msgspec refuses them in JSON input, but a task can return one);
- object keys without the NUL character (BSON keys are C strings); ``$`` and ``.`` in nested
  keys are fine (MongoDB 5.0 and later store them);
- at most :data:`MAX_DEPTH` levels of nested objects and arrays (MongoDB stores at most 100
  levels per document, the parameters or result field itself included);
- parameters at most :data:`MAX_PARAMETERS_BYTES` encoded as JSON: their BSON encoding (up to
  about six times larger for arrays of small numbers) stays far below MongoDB's 16 MiB document
  limit, and the run message that carries them below NATS's default 1 MiB payload limit.

Two policies, one range:

- **Input is refused.** :func:`check_parameters` raises :class:`core.errors.InvalidRequest`
  naming the first field outside the range (``parameters.n``); the gateway answers 422.
- **Output is kept, bounded.** What a task returns or raises is the record of a run that
  happened; refusing it would lose the run's status. :func:`storable_result` and
  :func:`storable_error` turn any value into one within the range: an integer outside int64
  becomes its decimal string, a lone surrogate its ``\\udXXX`` escape, NUL in a key U+FFFD, a
  subtree nested too deeply its JSON text, a non-finite float null; a result larger than
  :data:`MAX_RESULT_BYTES` as JSON becomes ``{"truncated": true, "bytes": <size>}``, one that is
  not JSON at all ``{"unencodable": "<repr>"}``, and an error keeps its first
  :data:`MAX_ERROR_CHARS` characters. Workers apply them before they report; both stores apply
  :func:`storable_event` to every event they record, so no event can poison the recorder.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from core.errors import FieldError, InvalidRequest
from core.model import StatusEvent

MIN_INT = -(2**63)
MAX_INT = 2**63 - 1
MAX_DEPTH = 32
"""Most levels of nested objects and arrays in a parameter or result value (``{"a": [1]}``
has two)."""
MAX_PARAMETERS_BYTES = 256 * 1024
"""Largest ``parameters`` of a job, encoded as JSON (bytes)."""
MAX_RESULT_BYTES = 16 * 1024
"""Largest stored run result, encoded as JSON (bytes); larger ones are replaced by their size."""
MAX_ERROR_CHARS = 2000
"""Longest stored run error (characters); longer ones are cut."""
MAX_REPR_CHARS = 200
"""Longest ``repr`` kept of a result that is not JSON."""

_json = msgspec.json.Encoder()
NUL = "\x00"
ESCAPED_NUL = "\\u0000"

INT_REASON = f"integers must lie within {MIN_INT} … {MAX_INT} (64 bits); send larger ones as text"
DEPTH_REASON = f"nests more than {MAX_DEPTH} levels of objects and arrays"


def value_problem(value: Any, path: str) -> FieldError | None:
    """The first part of ``value`` outside the stored range, as a field error naming it
    (``path`` is the value's own field, e.g. ``parameters``; a nested one reads
    ``parameters.items[2].n``), or None if all of it is within.

    ``value`` is what msgspec decodes JSON into: None, bool, int, float, str, list, dict. A
    value within the range is checked in one pass that builds no paths; only a value outside
    it is walked again, to name the field.
    """
    if _fits(value, 0):
        return None
    return _first_problem(value, path)


def _fits(value: Any, depth: int) -> bool:
    """Whether ``value`` (at nesting ``depth``) is within the range: the fast pass."""
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return False
        for key in value:
            if type(key) is not str or NUL in key or not is_text(key):
                return False
        return _items_fit(value.values(), depth)
    if isinstance(value, list):
        return depth < MAX_DEPTH and _items_fit(value, depth)
    return _scalar_problem(value) is None


def _items_fit(items: Iterable[Any], depth: int) -> bool:
    for child in items:
        kind = type(child)
        if kind is int:
            if not MIN_INT <= child <= MAX_INT:
                return False
        elif kind is str:
            if not child.isascii() and not is_text(child):
                return False
        elif kind is float:
            if not math.isfinite(child):
                return False
        elif not (kind is bool or child is None or _fits(child, depth + 1)):
            return False
    return True


def _first_problem(value: Any, path: str) -> FieldError | None:
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if not isinstance(item, dict | list):
            reason = _scalar_problem(item)
            if reason is not None:
                return FieldError(where, reason)
            continue
        if depth >= MAX_DEPTH:
            return FieldError(where, DEPTH_REASON)
        if isinstance(item, list):
            stack.extend(
                (item[i], f"{where}[{i}]", depth + 1) for i in range(len(item) - 1, -1, -1)
            )
            continue
        for key, child in reversed(item.items()):
            if not isinstance(key, str):
                return FieldError(where, "object keys must be strings")
            name = f"{where}.{key.replace(NUL, ESCAPED_NUL)}"
            if NUL in key:
                return FieldError(name, "object keys must not contain NUL (U+0000)")
            if not is_text(key):
                return FieldError(name, "object keys must be valid Unicode text")
            stack.append((child, name, depth + 1))
    return None


def _scalar_problem(item: Any) -> str | None:
    if isinstance(item, bool) or item is None:
        return None
    if isinstance(item, int):
        return None if MIN_INT <= item <= MAX_INT else INT_REASON
    if isinstance(item, float):
        return None if math.isfinite(item) else "must be a finite number"
    if isinstance(item, str):
        return None if is_text(item) else "must be valid Unicode text"
    return f"is not a JSON value ({type(item).__name__})"


def check_parameters(parameters: Mapping[str, Any], *, field: str = "parameters") -> None:
    """Refuse job parameters outside the stored range (see module docstring).

    Raises:
        InvalidRequest: naming ``parameters`` (too large) or the first offending field inside
            it, e.g. ``parameters.n`` for an integer of 2^64.
    """
    problem = value_problem(dict(parameters), field)
    if problem is not None:
        raise InvalidRequest(problem)
    size = len(_json.encode(parameters))
    if size > MAX_PARAMETERS_BYTES:
        raise InvalidRequest(
            FieldError(field, f"at most {MAX_PARAMETERS_BYTES} bytes as JSON; these are {size}")
        )


def storable_text(text: str, limit: int | None = None) -> str:
    """``text`` as valid Unicode (each lone surrogate written as its ``\\udXXX`` escape), cut to
    its first ``limit`` characters."""
    if not is_text(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if limit is None else text[:limit]


def storable_error(error: str | None) -> str | None:
    """A run's error within the stored range: valid text, at most :data:`MAX_ERROR_CHARS`."""
    return None if error is None else storable_text(error, MAX_ERROR_CHARS)


def storable_result(result: Any) -> Any:
    """A task's return value within the stored range (see module docstring): the same JSON
    value when it is within, else the nearest one that is. Never raises."""
    if result is None:
        return None
    try:
        plain = msgspec.to_builtins(result, str_keys=True)
    except (TypeError, ValueError, RecursionError):
        return {"unencodable": _repr(result)}
    try:
        size = len(_json.encode(plain))
    except (UnicodeEncodeError, RecursionError):
        size = 0  # a lone surrogate: measured after coercion
    if size > MAX_RESULT_BYTES:
        return {"truncated": True, "bytes": size}
    if size and _fits(plain, 0):
        return plain
    coerced = _coerce(plain, 0)
    size = len(_json.encode(coerced))
    return coerced if size <= MAX_RESULT_BYTES else {"truncated": True, "bytes": size}


def storable_event(event: StatusEvent) -> StatusEvent:
    """``event`` with its result and error within the stored range (itself when it has no
    result and its error is within)."""
    error = storable_error(event.error)
    if event.result is None and error == event.error:
        return event
    return msgspec.structs.replace(event, result=storable_result(event.result), error=error)


def _coerce(value: Any, depth: int) -> Any:
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_DEPTH:
            return _text_of(value)
        if isinstance(value, dict):
            return {
                storable_text(str(k)).replace("\x00", "\ufffd"): _coerce(v, depth + 1)
                for k, v in value.items()
            }
        return [_coerce(v, depth + 1) for v in value]  # a tuple, too: JSON has arrays only
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if MIN_INT <= value <= MAX_INT else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return storable_text(value)
    return storable_text(_repr(value))


def _text_of(value: Any) -> str:
    """A subtree nested too deeply, as its compact JSON text (valid text either way)."""
    try:
        return _json.encode(value).decode()
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        return storable_text(_repr(value))


def _repr(value: Any) -> str:
    try:
        return storable_text(repr(value), MAX_REPR_CHARS)
    except Exception:  # a broken __repr__ must not lose the run's outcome
        return f"<{type(value).__name__}>"


def is_text(s: str) -> bool:
    """Whether ``s`` is valid Unicode text: no lone surrogates, which no store can encode."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
