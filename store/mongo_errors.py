"""Driver errors of the MongoDB store, classified once: the store cannot be used now, or this
one write can never succeed.

- :class:`core.errors.StoreUnavailable` (retry; the actors wait, the gateway answers 503):
  connection errors, timeouts, elections, write-concern failures, errors the server labels
  ``RetryableWriteError`` or ``TransientTransactionError``, and every server error whose code is
  not known to be about the write itself — an unknown code is a problem of the store (its
  permissions, its state), which a retry may outlive and which no single message causes.
- :class:`core.errors.StoreRejected` (set the write aside): a value the driver cannot encode as
  BSON (an integer beyond 64 bits, NUL in a key, a lone surrogate, a document over 16 MiB), and
  the server codes of :data:`PERMANENT_CODES`, each about the document sent, never the store.
- :class:`core.errors.ConfigError` at start (:func:`index_error`): an index jobsched declares
  exists under its name with other keys or options (``IndexOptionsConflict``,
  ``IndexKeySpecsConflict``), or the server refuses to build it. No restart fixes that; an
  operator must drop the old index.

Codes and names are MongoDB's ``src/mongo/base/error_codes.yml``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from bson.errors import BSONError
from pymongo.errors import (
    BulkWriteError,
    DuplicateKeyError,
    ExecutionTimeout,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)

from core.errors import ConfigError, StoreRejected, StoreUnavailable

log = logging.getLogger(__name__)

DUPLICATE_KEY_CODES = frozenset({11000, 11001, 12582})

PERMANENT_CODES: Mapping[int, str] = {
    2: "BadValue",
    9: "FailedToParse",
    14: "TypeMismatch",
    15: "Overflow",  # e.g. a document nested deeper than 100 levels
    22: "InvalidBSON",
    28: "PathNotViable",
    30: "InvalidPath",
    40: "ConflictingUpdateOperators",
    52: "DollarPrefixedFieldName",
    53: "InvalidIdField",
    54: "NotSingleValueField",
    55: "InvalidDBRef",
    56: "EmptyFieldName",
    57: "DottedFieldName",
    66: "ImmutableField",
    121: "DocumentValidationFailure",
    10334: "BSONObjectTooLarge",
    17419: "document after update larger than 16 MiB",
    17420: "document after update larger than 16 MiB",
}
"""Server error codes about the document a write sends: the same write fails again."""

INDEX_CODES: Mapping[int, str] = {
    2: "BadValue",
    9: "FailedToParse",
    67: "CannotCreateIndex",
    68: "IndexAlreadyExists",
    72: "InvalidOptions",
    85: "IndexOptionsConflict",
    86: "IndexKeySpecsConflict",
    197: "InvalidIndexSpecificationOption",
}
"""Server error codes of ``createIndexes`` for an index that cannot be created as declared."""

TRANSIENT_LABELS = ("RetryableWriteError", "TransientTransactionError")

UNENCODABLE = (BSONError, OverflowError, UnicodeEncodeError)
"""What the driver raises while encoding a value BSON cannot hold (``InvalidDocument`` and
``DocumentTooLarge`` are ``BSONError``\\ s): raised before anything is sent."""


def is_permanent(error: PyMongoError) -> bool:
    """Whether ``error`` is about the write itself (see module docstring), never the store."""
    if any(error.has_error_label(label) for label in TRANSIENT_LABELS):
        return False
    if isinstance(error, BulkWriteError):
        details = error.details
        codes = [w.get("code") for w in details.get("writeErrors", [])]
        if details.get("writeConcernErrors") or not codes:
            return False
        return all(c in PERMANENT_CODES or c in DUPLICATE_KEY_CODES for c in codes) and any(
            c in PERMANENT_CODES for c in codes
        )
    if isinstance(error, ExecutionTimeout | WriteConcernError):
        return False
    return isinstance(error, OperationFailure) and error.code in PERMANENT_CODES


def rejected(action: str, error: BaseException) -> StoreRejected:
    """The :class:`StoreRejected` of ``action`` failing with ``error`` for good."""
    return StoreRejected(f"the store refuses this write ({action}): {_describe(error)}")


@contextmanager
def translated(action: str, *, passing: tuple[type[PyMongoError], ...] = ()) -> Iterator[None]:
    """Turn driver errors into :class:`StoreUnavailable` or :class:`StoreRejected`.

    Errors of the ``passing`` types go through untouched: the caller decides what a duplicate key
    means, and must not let them escape either. A rejection is not logged here: the caller sets
    the write aside and logs that once.
    """
    try:
        yield
    except passing:
        raise
    except UNENCODABLE as e:
        raise rejected(action, e) from e
    except PyMongoError as e:
        if is_permanent(e):
            raise rejected(action, e) from e
        log.warning("mongodb: %s failed: %s: %s", action, type(e).__name__, e)
        raise StoreUnavailable(
            f"the store cannot be used right now ({action}: {type(e).__name__})"
        ) from e


def index_error(
    error: BaseException, collection: str, name: str, declared: str
) -> ConfigError | None:
    """The configuration error of index ``collection.name`` when ``error`` (a translated
    driver error) says it cannot be created as declared (``declared`` describes it), else None.
    """
    cause = error.__cause__
    if not isinstance(cause, OperationFailure) or cause.code is None:
        return None
    if cause.code not in INDEX_CODES:
        return None
    return ConfigError(
        f"MongoDB index {collection}.{name} cannot be created as jobsched declares it "
        f"({declared}): {INDEX_CODES[cause.code]}: {_describe(cause)}. An index of that name or "
        f"those keys exists with other keys or options (an older jobsched, or made by hand): "
        f'drop it (db.{collection}.dropIndex("{name}")) and start jobsched again, which '
        "re-creates it."
    )


_DUPLICATE_INDEX = re.compile(r"index: (\S+) dup key")


def duplicate_index(error: DuplicateKeyError) -> str | None:
    """The name of the unique index a duplicate-key error is about, when the server names it
    (``E11000 duplicate key error collection: db.jobs index: <name> dup key: {…}``)."""
    details = error.details or {}
    match = _DUPLICATE_INDEX.search(str(details.get("errmsg") or error))
    return match.group(1) if match else None


def duplicate_indexes(error: BulkWriteError, action: str) -> set[int]:
    """The operations of a bulk write that failed on a duplicate key.

    Raises:
        StoreUnavailable: the bulk also failed otherwise, and not for good (a write-concern
            error: durability of its writes is unknown; an unknown or transient code).
        StoreRejected: the other failures are all about the documents sent.
    """
    details = error.details
    errors: list[dict[str, Any]] = details.get("writeErrors", [])
    others = [e for e in errors if e.get("code") not in DUPLICATE_KEY_CODES]
    if details.get("writeConcernErrors") or others:
        if not details.get("writeConcernErrors") and is_permanent(error):
            raise rejected(action, error) from error
        log.warning("mongodb bulk write failed: %s", details)
        raise StoreUnavailable("the store could not confirm a write; retry") from error
    return {e["index"] for e in errors}


def _describe(error: BaseException) -> str:
    if isinstance(error, BulkWriteError):
        first: dict[str, Any] = next(
            (
                w
                for w in error.details.get("writeErrors", [])
                if w.get("code") not in DUPLICATE_KEY_CODES
            ),
            {},
        )
        return f"{first.get('code')}: {first.get('errmsg', 'write error')}"
    if isinstance(error, OperationFailure):
        return f"{error.code}: {error.details.get('errmsg') if error.details else error}"
    return f"{type(error).__name__}: {error}"
